//! Plain-text tables for the terminal.

/// Renders rows under a header, each column as wide as its widest cell; numbers right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> =
        (0..header.len()).map(|c| rows.iter().map(|r| r[c].len()).chain([header[c].len()]).max().unwrap_or(0)).collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, &w)| {
                let numeric = cell.chars().next().is_some_and(|ch| ch.is_ascii_digit());
                if numeric {
                    format!("{cell:>w$}")
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    out.push(widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
    out.extend(rows.iter().map(|r| line(r.iter().map(String::as_str).collect())));
    out.join("\n")
}
