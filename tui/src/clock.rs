//! Wall-clock labels in UTC without a calendar dependency.

use std::time::{SystemTime, UNIX_EPOCH};

/// Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn parts(time: SystemTime) -> (i64, u32, u32, u64, u64, u64) {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (year, month, day) = civil((seconds / 86_400) as i64);
    let of_day = seconds % 86_400;
    (
        year,
        month,
        day,
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60,
    )
}

/// `14:03:27` (UTC).
pub fn time_of_day(time: SystemTime) -> String {
    let (_, _, _, hours, minutes, seconds) = parts(time);
    format!("{hours:02}:{minutes:02}:{seconds:02}")
}

/// `20261121-140327` (UTC), for file names.
pub fn file_stamp(time: SystemTime) -> String {
    let (year, month, day, hours, minutes, seconds) = parts(time);
    format!("{year:04}{month:02}{day:02}-{hours:02}{minutes:02}{seconds:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants() {
        // 2026-11-21T14:03:27Z
        let time = UNIX_EPOCH + Duration::from_secs(1_795_269_807);
        assert_eq!(time_of_day(time), "14:03:27");
        assert_eq!(file_stamp(time), "20261121-140327");
        assert_eq!(file_stamp(UNIX_EPOCH), "19700101-000000");
        // A leap day.
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(file_stamp(leap), "20000229-000000");
    }
}
