//! Plain-text tables that fit the terminal (80 columns unless `COLUMNS` says otherwise):
//! the widest columns are cut first, with `…`. Output to a pipe is never cut.

use std::io::IsTerminal;

pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Columns are this far apart.
const GAP: usize = 2;
/// A column is never cut below this.
const MIN: usize = 6;

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn add_columns(&mut self, headers: &[&str]) {
        self.headers.extend(headers.iter().map(|h| (*h).to_owned()));
    }

    pub fn row(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// The width to fit: `COLUMNS`, else 80 on a terminal, else none.
    fn width() -> Option<usize> {
        if let Some(c) = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()) {
            return Some(c);
        }
        std::io::stdout().is_terminal().then_some(80)
    }

    pub fn print(&self) {
        super::write_out(&self.render(Self::width()));
    }

    pub fn render(&self, width: Option<usize>) -> String {
        if self.rows.is_empty() {
            return "(none)\n".to_owned();
        }
        let len = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| len(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(len(cell));
                }
            }
        }
        if let Some(limit) = width {
            let total = |w: &[usize]| w.iter().sum::<usize>() + GAP * (w.len().saturating_sub(1));
            while total(&widths) > limit {
                let (i, &w) = widths
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, w)| **w)
                    .expect("a column");
                if w <= MIN {
                    break;
                }
                widths[i] = w - 1;
            }
        }
        let cut = |s: &str, w: usize| -> String {
            if len(s) <= w {
                format!("{s:<w$}")
            } else {
                let kept: String = s.chars().take(w.saturating_sub(1)).collect();
                format!("{kept}…")
            }
        };
        let line = |cells: &[String]| -> String {
            let parts: Vec<String> = widths
                .iter()
                .enumerate()
                .map(|(i, &w)| cut(cells.get(i).map_or("", String::as_str), w))
                .collect();
            format!("{}\n", parts.join(&" ".repeat(GAP)).trim_end())
        };
        let mut out = line(&self.headers);
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_fits_its_width_by_cutting_the_widest_column() {
        let mut t = Table::new(&["NAME", "NOTE"]);
        t.row(vec!["llm".into(), "x".repeat(100)]);
        t.row(vec!["embeddings".into(), "short".into()]);
        let out = t.render(Some(40));
        for l in out.lines() {
            assert!(l.chars().count() <= 40, "{l:?}");
        }
        assert!(out.contains('…'));
        assert!(out.lines().nth(2).unwrap().starts_with("embeddings  short"));
        // Not cut without a width (a pipe).
        assert!(t.render(None).contains(&"x".repeat(100)));
    }
}
