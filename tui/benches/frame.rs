//! Dashboard frame costs, on ratatui's `TestBackend` (the drawing work without a terminal's
//! I/O): `cargo bench -p tui --bench frame`.
//!
//! - one frame of the resource table of a type with 10,000 resources (goal: < 16 ms);
//! - applying 1,000 watch events to that state and preparing the next frame (goal: < 50 ms);
//! - a listing of 1,000,000 resources arriving in the runtime's batches of 4,096 events, a
//!   frame drawn after each (goal: every batch and its frame < 100 ms, so keys still answer),
//!   then scrolling, a sort change, a filter and 1,000 updates between two frames (goal: <
//!   100 ms) at a million rows. `FRAME_ROWS=N` changes the
//!   million (the dashboard keeps every row of the type it shows in memory).

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::hint::black_box;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tui::msg::Msg;
use tui::state::State;
use tui::testing::{condition, end_of_snapshot, large_state, resource, upsert, with_status};
use tui::update::update;
use tui::view;

const ROWS: usize = 10_000;

fn stats(name: &str, mut samples: Vec<Duration>, goal: Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    let verdict = if at(0.99) < goal { "meets" } else { "MISSES" };
    println!(
        "{name:<58} n={:<4} mean {:>8.3} ms  p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms  ({verdict} the {} ms goal)",
        samples.len(),
        mean.as_secs_f64() * 1e3,
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3,
        goal.as_millis(),
    );
}

fn frame(terminal: &mut Terminal<TestBackend>, state: &mut State) -> Duration {
    let started = Instant::now();
    state.page = view::page_rows(terminal.size().map(|s| s.height).unwrap_or(50));
    state.prepare();
    terminal
        .draw(|frame| view::render(state, frame))
        .expect("draws");
    started.elapsed()
}

fn key(state: &mut State, code: KeyCode) {
    update(state, Msg::Key(KeyEvent::new(code, KeyModifiers::NONE)));
}

/// Events the runtime hands the state at once (its batch of watch messages).
const BATCH: usize = 4_096;

/// A listing of `rows` resources arriving batch by batch, a frame after each; then the table at
/// that size.
fn listing(terminal: &mut Terminal<TestBackend>, rows: usize) {
    let gvk = "demo.v1.Concept";
    let mut state = large_state(0);
    if let Some(data) = state.store.get_mut(gvk) {
        data.synced = false;
    }
    let watch = |event| Msg::Watch {
        gvk: gvk.into(),
        update: proto::client::WatchUpdate::Event(event),
    };
    let started = Instant::now();
    let mut samples = Vec::new();
    for first in (0..rows).step_by(BATCH) {
        let batch = Instant::now();
        for i in first..(first + BATCH).min(rows) {
            let name = format!("listed-{i:07}");
            let concept = resource(gvk, "default/jazz", &name, i as u64 + 1);
            black_box(update(&mut state, watch(upsert(concept))));
        }
        frame(terminal, &mut state);
        samples.push(batch.elapsed());
    }
    let arrived = started.elapsed();
    let ended = Instant::now();
    update(&mut state, watch(end_of_snapshot(&(rows + 1).to_string())));
    frame(terminal, &mut state);
    let ended = ended.elapsed();
    stats(
        &format!("{rows}-row listing: {BATCH} events + a frame"),
        samples,
        Duration::from_millis(100),
    );
    println!(
        "{rows}-row listing: all arrived and drawn in {:.2} s; the frame after its end (one full sort) {:.1} ms",
        arrived.as_secs_f64(),
        ended.as_secs_f64() * 1e3
    );
    let samples = (0..200)
        .map(|i| {
            key(
                &mut state,
                if i % 2 == 0 {
                    KeyCode::PageDown
                } else {
                    KeyCode::Down
                },
            );
            frame(terminal, &mut state)
        })
        .collect();
    stats(
        &format!("frame, {rows}-row table, scrolling"),
        samples,
        Duration::from_millis(16),
    );
    let samples = (0..5)
        .map(|_| {
            key(&mut state, KeyCode::Char('s'));
            frame(terminal, &mut state)
        })
        .collect();
    stats(
        &format!("frame, {rows}-row table, after a sort change"),
        samples,
        Duration::from_millis(1_000),
    );
    let samples = ["l", "li", "lis", "list", "listed-00"]
        .iter()
        .map(|typed| {
            state.resources.filter = (*typed).to_owned();
            frame(terminal, &mut state)
        })
        .collect();
    stats(
        &format!("frame, {rows}-row table, each key typed into the filter"),
        samples,
        Duration::from_millis(1_000),
    );
    // Churn on a live table sorted by version: each update moves its row to the end.
    state.resources.filter.clear();
    while state.resources.sort != tui::state::SortKey::Version {
        key(&mut state, KeyCode::Char('s'));
    }
    frame(terminal, &mut state);
    let mut version = rows as u64 + 10;
    let samples = (0..50)
        .map(|round| {
            let started = Instant::now();
            for i in 0..1_000usize {
                version += 1;
                let name = format!("listed-{:07}", (round * 7_919 + i * 104_729) % rows);
                let concept = resource(gvk, "default/jazz", &name, version);
                black_box(update(&mut state, watch(upsert(concept))));
            }
            frame(terminal, &mut state);
            started.elapsed()
        })
        .collect();
    stats(
        &format!("1,000 updates + a frame, {rows}-row table by version"),
        samples,
        Duration::from_millis(100),
    );
}

fn main() {
    let mut terminal = Terminal::new(TestBackend::new(200, 50)).expect("test terminal");
    let rows = std::env::var("FRAME_ROWS")
        .ok()
        .and_then(|rows| rows.parse().ok())
        .unwrap_or(1_000_000);
    listing(&mut terminal, rows);
    let mut state = large_state(ROWS);
    frame(&mut terminal, &mut state);

    // Scrolling: each frame moves the selection (the rows are already sorted).
    let samples = (0..500)
        .map(|i| {
            key(
                &mut state,
                if i % 50 < 25 {
                    KeyCode::PageDown
                } else {
                    KeyCode::Down
                },
            );
            frame(&mut terminal, &mut state)
        })
        .collect();
    stats(
        "frame, 10,000-row table, scrolling",
        samples,
        Duration::from_millis(16),
    );

    // Re-sorting: the rows are rebuilt (filter + sort of 10,000) in the frame.
    let samples = (0..100)
        .map(|_| {
            key(&mut state, KeyCode::Char('s'));
            frame(&mut terminal, &mut state)
        })
        .collect();
    stats(
        "frame, 10,000-row table, after a sort change",
        samples,
        Duration::from_millis(16),
    );

    // 1,000 watch events (updates with a changed condition and new resources), applied
    // through update() as the runtime does, then the next frame's prepare.
    let gvk = "demo.v1.Concept";
    let mut round = 0u64;
    let samples = (0..50)
        .map(|_| {
            round += 1;
            let events: Vec<Msg> = (0..1_000u64)
                .map(|i| {
                    let name = if i % 10 == 0 {
                        format!("new-{round}-{i}")
                    } else {
                        format!("concept-{:05}", (i * 7 + round) % ROWS as u64)
                    };
                    let concept = with_status(
                        resource(gvk, "default/jazz", &name, 20_000 + round * 1_000 + i),
                        "observer",
                        "1",
                        vec![condition(
                            "Seen",
                            proto::resource::v1::State::True,
                            "Observed",
                            "",
                        )],
                    );
                    Msg::Watch {
                        gvk: gvk.into(),
                        update: proto::client::WatchUpdate::Event(upsert(concept)),
                    }
                })
                .collect();
            let started = Instant::now();
            for msg in events {
                black_box(update(&mut state, msg));
            }
            state.prepare();
            started.elapsed()
        })
        .collect();
    stats(
        "apply 1,000 watch events + prepare (10,000+ rows)",
        samples,
        Duration::from_millis(50),
    );
    let samples = (0..100).map(|_| frame(&mut terminal, &mut state)).collect();
    stats(
        &format!(
            "frame after the events ({} rows)",
            state.resources.rows.keys.len()
        ),
        samples,
        Duration::from_millis(16),
    );
}
