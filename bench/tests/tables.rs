//! The benchmark tables in docs/benchmarks.md are what the bench files they
//! name say: each block between `<!-- bench-tables: PATH -->` and
//! `<!-- /bench-tables -->` is rendered again from PATH (a bench.json that
//! `modstream bench` wrote) and must be the same, figure for figure.

use std::path::Path;

use modstream_bench::{TABLES_BEGIN, splice_tables};

/// The repository's root (this crate is bench/).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
fn benchmark_tables_are_rendered_from_the_files_they_name() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("docs/benchmarks.md")).unwrap();
    let blocks = doc.matches(TABLES_BEGIN).count();
    assert!(
        blocks >= 3,
        "docs/benchmarks.md has {blocks} generated blocks"
    );
    let again = splice_tables(&doc, root).unwrap();
    if again != doc {
        let first = doc
            .lines()
            .zip(again.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "docs/benchmarks.md differs from its bench files from line {} on; run `modstream bench --update-docs docs/benchmarks.md`\n  doc: {:?}\n file: {:?}",
            first + 1,
            doc.lines().nth(first),
            again.lines().nth(first)
        );
    }
}

#[test]
fn a_block_is_rendered_from_its_file_and_a_missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let report = r#"{"machine": "2 cores", "model": "m 1", "intra_threads": 1,
        "saturation": [{"max_batch_size": 8, "max_batch_delay_ms": 5, "events": 100,
          "pipeline_per_s": 1234.4, "raw_model_per_s": 1000.0, "pipeline_over_raw": 1.2344,
          "mean_batch_size": 7.5, "inference_share": 0.5, "run_sizes": {},
          "batch_wait_ms": 3.0, "inference_ms": 0.5, "produce_ms": 1.3}],
        "latency": [], "peak_rss_bytes": 104857600}"#;
    std::fs::write(dir.path().join("bench.json"), report).unwrap();
    let doc = "intro\n<!-- bench-tables: bench.json -->\nstale 999\n<!-- /bench-tables -->\nend\n";
    let spliced = splice_tables(doc, dir.path()).unwrap();
    assert!(
        spliced.contains("| 8 | 5 ms | 100 | 1234 | 1000 | 1.23 | 7.5 | 3 / 0.5 / 1.3 |"),
        "{spliced}"
    );
    assert!(!spliced.contains("stale 999"));
    assert!(spliced.starts_with("intro\n") && spliced.ends_with("<!-- /bench-tables -->\nend\n"));
    assert_eq!(
        splice_tables(&spliced, dir.path()).unwrap(),
        spliced,
        "stable"
    );
    let missing = "<!-- bench-tables: nowhere.json -->\n<!-- /bench-tables -->\n";
    assert!(splice_tables(missing, dir.path()).is_err());
}
