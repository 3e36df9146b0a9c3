//! The terminal's modes: raw mode and the alternate screen while the dashboard runs, restored
//! on quit, on error, on panic (a hook), and around `$EDITOR` (suspend / resume).

use std::io::{Stdout, stdout};
use std::sync::Once;

use crossterm::cursor::{Hide, Show};
use crossterm::execute;
use crossterm::terminal::{
    Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

pub type Term = Terminal<CrosstermBackend<Stdout>>;

static PANIC_HOOK: Once = Once::new();

/// Puts the terminal back the way the shell expects it. Safe to call more than once.
pub fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(stdout(), LeaveAlternateScreen, Show);
}

/// Raw mode and the alternate screen; a panic restores the terminal before its message prints.
pub fn enter() -> std::io::Result<Term> {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
    enable_raw_mode()?;
    let entered = execute!(stdout(), EnterAlternateScreen, Hide, Clear(ClearType::All))
        .and_then(|()| Terminal::new(CrosstermBackend::new(stdout())));
    if entered.is_err() {
        restore();
    }
    entered
}

/// Hands the terminal to another program (the editor).
pub fn suspend() {
    restore();
}

/// Takes the terminal back after [`suspend`]; the next frame redraws everything. (A fresh
/// `Terminal` rather than `Terminal::clear`, which asks the terminal for the cursor position —
/// an answer the key reader can swallow.)
pub fn resume(terminal: &mut Term) -> std::io::Result<()> {
    enable_raw_mode()?;
    execute!(stdout(), EnterAlternateScreen, Hide, Clear(ClearType::All))?;
    *terminal = Terminal::new(CrosstermBackend::new(stdout()))?;
    Ok(())
}

/// Restores the terminal when dropped, so an early return or error cannot leave it raw.
#[derive(Debug)]
pub struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}
