//! Table columns sized to their content: every column gets what its widest cell needs (up to
//! its cap); when the terminal is narrower, the least important columns shrink to their minimum
//! first, then disappear, so the most important one (a resource's NAME) keeps its width longest.
//! Cells cut to a column's width end in `…`.

use ratatui::text::Span;
use unicode_width::UnicodeWidthStr as _;

/// One column: its header, how wide it may grow and shrink, and how much it matters
/// (higher keeps its width longer).
#[derive(Debug, Clone)]
pub(super) struct Column {
    pub header: std::borrow::Cow<'static, str>,
    pub min: u16,
    pub max: u16,
    pub priority: u8,
}

/// The width of each column (0 = left out) for cells of `natural` widths in `available`
/// columns, with `spacing` between shown columns.
pub(super) fn fit(columns: &[Column], natural: &[u16], available: u16, spacing: u16) -> Vec<u16> {
    let mut widths: Vec<u16> = columns
        .iter()
        .zip(natural)
        .map(|(column, natural)| (*natural).max(column.header.width() as u16).min(column.max))
        .collect();
    let total = |widths: &[u16]| -> u32 {
        let shown: Vec<u32> = widths
            .iter()
            .filter(|w| **w > 0)
            .map(|w| u32::from(*w))
            .collect();
        shown.iter().sum::<u32>() + u32::from(spacing) * shown.len().saturating_sub(1) as u32
    };
    // Least important first; among equals, the rightmost. The last is the one that matters
    // most: it shrinks only when it is alone.
    let mut order: Vec<usize> = (0..columns.len()).collect();
    order.sort_by_key(|index| (columns[*index].priority, std::cmp::Reverse(*index)));
    let Some((&top, others)) = order.split_last() else {
        return widths;
    };
    let fits = |widths: &[u16]| total(widths) <= u32::from(available);
    // The others shrink toward their minimum…
    for &index in others {
        let excess = total(&widths).saturating_sub(u32::from(available));
        let floor = columns[index].min.min(widths[index]);
        let cut = u32::from(widths[index] - floor).min(excess) as u16;
        widths[index] -= cut;
    }
    // …then leave, least important first, and what they free goes back to those that stay,
    // most important first.
    if !fits(&widths) {
        for &index in others {
            widths[index] = 0;
            if fits(&widths) {
                break;
            }
        }
        let natural_of = |index: usize| {
            natural[index]
                .max(columns[index].header.width() as u16)
                .min(columns[index].max)
        };
        for &index in others.iter().rev() {
            if widths[index] == 0 {
                continue;
            }
            let spare = u32::from(available).saturating_sub(total(&widths));
            let grow = u32::from(natural_of(index).saturating_sub(widths[index])).min(spare);
            widths[index] += grow as u16;
        }
    }
    if !fits(&widths) {
        widths[top] = widths[top].min(available);
    }
    widths
}

/// `text` cut to `width` display columns, ending in `…` when cut.
pub(super) fn ellipsize(text: &str, width: u16) -> String {
    let width = usize::from(width);
    if text.width() <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let mut cut = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        cut.push(c);
        used += w;
    }
    cut.push('…');
    cut
}

/// A styled cell cut to `width`.
pub(super) fn cut_span(span: &Span<'static>, width: u16) -> Span<'static> {
    Span::styled(ellipsize(&span.content, width), span.style)
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: [Column; 3] = [
        Column {
            header: std::borrow::Cow::Borrowed("NAME"),
            min: 8,
            max: 60,
            priority: 9,
        },
        Column {
            header: std::borrow::Cow::Borrowed("CONDITION"),
            min: 9,
            max: 30,
            priority: 5,
        },
        Column {
            header: std::borrow::Cow::Borrowed("OWNER"),
            min: 6,
            max: 40,
            priority: 1,
        },
    ];

    #[test]
    fn content_widths_when_everything_fits() {
        assert_eq!(fit(&COLUMNS, &[20, 14, 10], 100, 1), [20, 14, 10]);
        // Headers count; caps hold.
        assert_eq!(fit(&COLUMNS, &[2, 2, 90], 200, 1), [4, 9, 40]);
    }

    #[test]
    fn the_least_important_shrink_first_then_leave() {
        // 30 + 20 + 20 + 2 spaces = 72 > 60: OWNER gives 12 (to 8)…
        assert_eq!(fit(&COLUMNS, &[30, 20, 20], 60, 1), [30, 20, 8]);
        // …then CONDITION gives what it can, NAME untouched.
        assert_eq!(fit(&COLUMNS, &[30, 20, 20], 50, 1), [30, 12, 6]);
        // Too narrow for all three at their minimum: OWNER goes, CONDITION takes the room.
        assert_eq!(fit(&COLUMNS, &[30, 20, 20], 42, 1), [30, 11, 0]);
        // Narrower still: NAME alone, cut to what there is.
        assert_eq!(fit(&COLUMNS, &[30, 20, 20], 20, 1), [20, 0, 0]);
    }

    #[test]
    fn cut_cells_end_in_an_ellipsis() {
        assert_eq!(ellipsize("john-coltrane-album-1", 10), "john-colt…");
        assert_eq!(ellipsize("short", 10), "short");
        assert_eq!(ellipsize("ab", 0), "");
    }
}
