use super::*;

/// Every pattern name BENCH.md's tables define ("x / -y" names two), read from the file.
fn bench_md_names() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/BENCH.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("BENCH.md must be at {}: {e}", path.display()));
    let mut names = Vec::new();
    for row in text.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| pattern")) {
        let cell = row.split('|').nth(1).unwrap_or_default().trim();
        if cell == "QD sweep" {
            continue; // a sweep of the enterprise patterns, not a pattern
        }
        let (first, second) = cell.split_once(" / ").map_or((cell, None), |(a, b)| (a, Some(b)));
        names.push(first.to_string());
        if let Some(second) = second {
            let suffix = second.trim_start_matches('-');
            let stem = match second.starts_with('-') {
                true => first.rsplit_once('-').map(|(stem, _)| stem).unwrap_or(first).to_string() + "-",
                false => String::new(),
            };
            names.push(stem + suffix);
        }
    }
    names
}

#[test]
fn the_table_covers_every_bench_md_pattern() {
    let names = bench_md_names();
    assert!(names.len() >= 25, "parsed too few names from BENCH.md: {names:?}");
    for name in &names {
        assert!(find(name).is_ok(), "BENCH.md defines {name:?}, the pattern table does not");
    }
    // The software-RAID matrix is a section of its own in BENCH.md, without a table row.
    assert!(find("software-raid-matrix").is_ok());
}

#[test]
fn every_pattern_is_valid_and_every_suite_names_patterns() {
    for pattern in PATTERNS {
        assert!(!pattern.description.is_empty(), "{}", pattern.name);
        let points = pattern.points(&SweepOptions::default());
        assert!(!points.is_empty());
        for chart in pattern.charts {
            assert!(pattern.sweep.iter().any(|(a, _)| *a == chart.x), "{}: chart over an axis it does not sweep", pattern.name);
        }
    }
    for suite in SUITES {
        assert!(!suite.members().is_empty(), "{}", suite.name);
    }
    let unique: std::collections::HashSet<&str> = PATTERNS.iter().map(|p| p.name).collect();
    assert_eq!(unique.len(), PATTERNS.len(), "pattern names are unique");
}

#[test]
fn sweeps_expand_to_the_defined_points() {
    let count = |name: &str| find(name).unwrap().points(&SweepOptions::default()).len();
    assert_eq!(count("review-database"), 11 * 9);
    assert_eq!(count("workstation"), 6);
    assert_eq!(count("review-multithreaded-read"), 32);
    assert_eq!(count("software-raid-matrix"), 3 * 2 * 2 * 9);
    assert_eq!(count("hba-iops"), 1);
    let database = find("review-database").unwrap().points(&SweepOptions::default());
    // Last axis fastest: the queue depth runs through before the write share moves.
    assert_eq!(database[1].coordinates, BTreeMap::from([("queue_depth".into(), 2), ("write_percent".into(), 0)]));
    assert_eq!(database[9].groups[0].spec.lines()[0].read_percent, 90);
    assert_eq!(database[9].groups[0].queue_depth, 1);
}

#[test]
fn quick_and_qd_options_reshape_the_sweep() {
    let quick = SweepOptions { quick: true, ..SweepOptions::default() };
    let axes = find("review-database").unwrap().axes(&quick);
    assert_eq!(axes, vec![(Axis::WritePercent, vec![0, 50, 100]), (Axis::QueueDepth, vec![1, 16, 256])]);
    let qd = SweepOptions { queue_depths: Some(vec![1, 32]), ..SweepOptions::default() };
    assert_eq!(find("review-sequential-read").unwrap().axes(&qd).last(), Some(&(Axis::QueueDepth, vec![1, 32])));
    assert_eq!(find("oltp").unwrap().axes(&qd), vec![(Axis::QueueDepth, vec![1, 32])]);
    let block = SweepOptions { block_sizes: Some(vec![4096]), queue_depths: Some(vec![32]), quick: true, ..SweepOptions::default() };
    assert_eq!(find("review-random-read").unwrap().axes(&block), vec![(Axis::BlockBytes, vec![4096]), (Axis::QueueDepth, vec![32])]);
    let point = &find("oltp").unwrap().points(&block)[0];
    assert_eq!((point.groups[0].spec.lines()[0].block_bytes, point.groups[0].queue_depth), (4096, 32));
    let workers = SweepOptions { workers: Some(vec![2]), queue_depths: Some(vec![1]), ..SweepOptions::default() };
    let points = find("review-multithreaded-read").unwrap().points(&workers);
    assert_eq!(points.len(), 1, "one worker count and one queue depth: one point");
    assert_eq!((points[0].groups[0].workers, points[0].groups[0].queue_depth), (2, 1));
}

#[test]
fn distributions_come_from_the_pattern_unless_replaced() {
    let defaults = SweepOptions::default();
    let skewed = find("oltp-skewed").unwrap();
    let oltp = find("oltp").unwrap();
    assert_eq!(skewed.points(&defaults)[0].groups[0].distribution.text(), "zoned:90/10:10/90");
    assert_eq!(oltp.points(&defaults)[0].groups[0].distribution, Distribution::Uniform);
    assert_eq!(skewed.group_descriptions(&defaults)[0].distribution, "zoned:90/10:10/90");
    let zipf = SweepOptions { distribution: Some(Distribution::Zipf { theta: 1.1 }), ..SweepOptions::default() };
    for pattern in [skewed, oltp] {
        assert!(pattern.points(&zipf).iter().all(|p| p.groups[0].distribution.text() == "zipf:1.1"), "{}", pattern.name);
        assert_eq!(pattern.group_descriptions(&zipf)[0].distribution, "zipf:1.1");
    }
    for pattern in PATTERNS {
        for group in pattern.groups {
            let _ = group.default_distribution();
        }
    }
}

#[test]
fn review_suite_fits_fifteen_minutes_at_the_default_point_length() {
    let points: usize = find_suite("review").unwrap().members().iter().map(|p| p.points(&SweepOptions::default()).len()).sum();
    // 2 s measured + 0.5 s ramp per point, with up to 1 s of drain and setup.
    assert!(points as f64 * 3.5 < 15.0 * 60.0, "{points} points");
}
