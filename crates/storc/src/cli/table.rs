//! storcli's text shapes: dashed tables, underlined section titles, `key = value` lines, and the
//! units people read (sizes in binary units, times in UTC).

/// Columns separated by one space and padded to the widest cell, between dashed lines, as storcli
/// prints them (scripts that split on whitespace keep working).
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table { header: header.iter().map(|title| title.to_string()).collect(), rows: Vec::new() }
    }

    pub fn push(&mut self, row: Vec<String>) {
        assert_eq!(row.len(), self.header.len(), "a row has one cell per column");
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|title| title.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
            padded.join(" ").trim_end().to_string()
        };
        let dashes = "-".repeat(widths.iter().sum::<usize>() + widths.len().saturating_sub(1));
        let mut text = format!("{dashes}\n{}\n{dashes}\n", line(&self.header));
        for row in &self.rows {
            text += &line(row);
            text.push('\n');
        }
        text + &dashes + "\n"
    }
}

/// A titled block: `TITLE :`, an underline, a blank line, the body.
pub fn section(title: &str, body: &str) -> String {
    let underline = "=".repeat(title.chars().count() + 2);
    format!("\n{title} :\n{underline}\n\n{body}")
}

/// `key = value` lines, storcli's form for properties.
pub fn key_values(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(key, value)| format!("{key} = {value}\n")).collect()
}

/// `48.0 GiB`: one decimal in the largest binary unit that keeps the number at least 1.
pub fn human_size(size_bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if size_bytes < 1024 {
        return format!("{size_bytes} B");
    }
    let mut value = size_bytes as f64;
    let mut unit_index = 0;
    while value >= 1024.0 && unit_index + 1 < UNITS.len() {
        value /= 1024.0;
        unit_index += 1;
    }
    format!("{value:.1} {}", UNITS[unit_index])
}

/// Strips are powers of two from 8 KiB to 1 MiB, so whole KiB or MiB say them exactly.
pub fn strip_size(strip_size_bytes: u64) -> String {
    const MIB_BYTES: u64 = 1 << 20;
    if strip_size_bytes >= MIB_BYTES && strip_size_bytes.is_multiple_of(MIB_BYTES) {
        format!("{} MiB", strip_size_bytes / MIB_BYTES)
    } else if strip_size_bytes.is_multiple_of(1024) {
        format!("{} KiB", strip_size_bytes / 1024)
    } else {
        format!("{strip_size_bytes} B")
    }
}

/// `2023-11-14T22:13:20Z`. The daemon sends Unix seconds; every client formats them in UTC, so
/// two people comparing output see the same times.
pub fn utc_time(unix_secs: u64) -> String {
    const SECS_PER_DAY: u64 = 86_400;
    let (year, month, day) = civil_from_days((unix_secs / SECS_PER_DAY) as i64);
    let secs_of_day = unix_secs % SECS_PER_DAY;
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar: Howard
/// Hinnant's `civil_from_days`, which counts in 400-year eras starting on March 1st.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted_days = days + 719_468;
    let era = shifted_days.div_euclid(146_097);
    let day_of_era = shifted_days.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    debug_assert!((1..=12).contains(&month) && (1..=31).contains(&day));
    (year, month as u32, day as u32)
}

/// Days since 1970-01-01 of a civil date: the inverse of `civil_from_days` (Howard Hinnant's
/// `days_from_civil`).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_columns_between_dashed_lines() {
        let mut table = Table::new(&["DG/VD", "TYPE", "Name"]);
        table.push(vec!["0/0".into(), "RAID5".into(), "db".into()]);
        table.push(vec!["1/1".into(), "RAID10".into(), "".into()]);
        let expected = "\
-----------------
DG/VD TYPE   Name
-----------------
0/0   RAID5  db
1/1   RAID10
-----------------
";
        assert_eq!(table.render(), expected);
    }

    #[test]
    fn sizes() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (48 << 30, "48.0 GiB"),
            ((3 << 40) + (1 << 39), "3.5 TiB"),
            (u64::MAX, "16.0 EiB"),
        ];
        for (size_bytes, expected) in cases {
            assert_eq!(human_size(size_bytes), expected, "for {size_bytes} bytes");
        }
        assert_eq!(strip_size(64 << 10), "64 KiB");
        assert_eq!(strip_size(1 << 20), "1 MiB");
        assert_eq!(strip_size(8 << 10), "8 KiB");
    }

    #[test]
    fn times_in_utc() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(951_955_199), "2000-03-01T23:59:59Z");
        assert_eq!(utc_time(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc_time(4_102_444_800), "2100-01-01T00:00:00Z");
    }
}
