//! The bounds of an agent's sync report, applied item by item, by both sides.
//!
//! A report is judged one item at a time: a GPU entry, a task report, a port, a work figure
//! or a text that breaks a bound is dropped or cut, and what was done is returned as a
//! [`Dropped`] naming its owner (the host, a GPU, a task) so that it can be recorded there.
//! The rest of the report, and the host's liveness with it, is never refused for one bad
//! item: a task's own `/metrics` or health output must not cost its host (and every other
//! task on it) a sync.
//!
//! The agent calls `SyncRequest::sanitize` (in `agent`) on every report before sending it (after it has
//! masked secrets, so a cut never leaves half a secret behind), and the server calls it again
//! on what arrives: an honest agent's report passes unchanged, and whatever a dishonest one
//! sends is brought within the same bounds, from this one definition.

use crate::ids::GpuUuid;

/// Whose item a bound dropped or cut.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    /// The host's own fields, or an item that names no owner the server could find (a
    /// task report whose id is not one).
    Host,
    /// One of the host's GPUs: the server keeps what it knows of it.
    Gpu(GpuUuid),
    /// One task, by id.
    Task(String),
}

/// One item a bound dropped or cut, and why: the text recorded on its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub owner: Owner,
    /// Where in the report, e.g. `tasks[3].work`.
    pub field: String,
    /// What was wrong, and what was done with it.
    pub reason: String,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// Whether `c` may stand in a report's text: a control character (NUL, an escape that
/// could rewrite an operator's terminal) may not, a line break or a tab may.
fn shown(c: char) -> bool {
    !c.is_control() || c == '\n' || c == '\t'
}

/// `s` with every control character but line breaks and tabs made `�`, and at most `max`
/// characters (as JSON Schema's `maxLength` counts them), or `None` when it already is. A
/// text too long keeps its end (the last line of a check's output, the innermost cause of
/// an error), after a `…` that says something was cut.
pub fn cut_text(s: &str, max: usize) -> Option<String> {
    let chars = s.chars().count();
    if chars <= max && s.chars().all(shown) {
        return None;
    }
    let clean = |c: char| if shown(c) { c } else { '\u{fffd}' };
    if chars <= max {
        return Some(s.chars().map(clean).collect());
    }
    let keep = max.saturating_sub(1);
    let tail = s.chars().skip(chars - keep).map(clean);
    Some(if max == 0 {
        String::new()
    } else {
        std::iter::once('…').chain(tail).collect()
    })
}

/// Whether `s` is within `max` characters and has no control character but line breaks
/// and tabs.
pub fn text_ok(s: &str, max: usize) -> bool {
    s.chars().all(shown) && s.chars().count() <= max
}

/// An advertised address: a host name or an IP address, nothing more.
pub fn address_ok(a: &str) -> bool {
    !a.is_empty()
        && a.len() <= 253
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_keep_their_end_and_lose_nul() {
        assert_eq!(cut_text("short", 10), None);
        assert_eq!(
            cut_text("a\0b\x1b[2J", 10).as_deref(),
            Some("a\u{fffd}b\u{fffd}[2J")
        );
        assert_eq!(cut_text("two\nlines\tand a tab", 40), None);
        let cut = cut_text("0123456789", 5).expect("cut");
        assert_eq!(cut, "…6789");
        assert_eq!(cut.chars().count(), 5);
        // Characters, not bytes: a long line of multi-byte characters is cut by count.
        let wide = "é".repeat(2000);
        let cut = cut_text(&wide, 1024).expect("cut");
        assert_eq!(cut.chars().count(), 1024);
        assert!(text_ok(&cut, 1024));
    }
}
