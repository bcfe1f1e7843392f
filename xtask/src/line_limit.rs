//! The first step of `cargo xtask ci`: a warning for each non-test Rust source file longer than
//! [`WARN_LINES`]. A warning, never a failure: a module holds one concern, and a file is split
//! by what it holds, never by its length alone (a gate on length made splits that imported
//! private items back from their sibling); a long file is a place to look.
//!
//! Which files count ("non-test source"): every `.rs` file under the `src/` directory of each crate
//! of the workspace (each directory next to the root `Cargo.toml` that holds a `Cargo.toml` of its
//! own), except
//! - files under a directory named `tests`, `benches` or `examples` (inside `src/`; the crate-level
//!   `tests/`, `benches/` and `examples/` are outside `src/` anyway), and
//! - files named `tests.rs` or ending in `_tests.rs` (unit tests kept beside their module, e.g.
//!   `allocator/src/free_index_tests.rs`).
//!
//! The directories are walked rather than asked of `git ls-files`, so a new file fails the check
//! before it is committed. A line is what `str::lines` counts (as `wc -l` does, plus a last line
//! without a newline).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Lines past which a non-test source file is printed as a warning.
pub const WARN_LINES: usize = 800;

/// Directory names whose contents are test, bench or example code wherever they sit.
const NON_SOURCE_DIRS: [&str; 3] = ["tests", "benches", "examples"];

/// The warnings for the workspace at `root`: one line naming each non-test source file longer
/// than [`WARN_LINES`] and its line count, longest first (none when every file is shorter).
pub fn warnings(root: &Path) -> Result<Vec<String>> {
    let files = line_counts(root)?;
    Ok(over_limit(&files, WARN_LINES)
        .iter()
        .map(|(path, lines)| {
            format!(
                "warning: {} has {lines} lines (over {WARN_LINES}): does it hold one concern? \
                 Split it by what it holds if not, never by length alone",
                path.display()
            )
        })
        .collect())
}

/// The files of `files` longer than `max_lines`, longest first (then by path).
pub fn over_limit(files: &[(PathBuf, usize)], max_lines: usize) -> Vec<(PathBuf, usize)> {
    let mut long: Vec<(PathBuf, usize)> = files
        .iter()
        .filter(|(_, lines)| *lines > max_lines)
        .cloned()
        .collect();
    long.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    long
}

/// Whether `relative`, a path inside a crate's `src/` directory, is non-test source (see the
/// module docs).
pub fn is_non_test_source(relative: &Path) -> bool {
    let Some(name) = relative.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let in_test_dir = relative
        .parent()
        .into_iter()
        .flat_map(Path::components)
        .any(|c| NON_SOURCE_DIRS.iter().any(|d| c.as_os_str() == *d));
    name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") && !in_test_dir
}

/// Every non-test source file of the workspace at `root`, as (path relative to `root`, lines),
/// sorted by path.
pub fn line_counts(root: &Path) -> Result<Vec<(PathBuf, usize)>> {
    let mut files = Vec::new();
    for entry in read_dir_sorted(root)? {
        let src = entry.join("src");
        if entry.join("Cargo.toml").is_file() && src.is_dir() {
            collect(&src, &src, root, &mut files)?;
        }
    }
    files.sort();
    Ok(files)
}

/// Adds the non-test sources under `dir` (inside the `src` directory `src`) to `files`.
fn collect(src: &Path, dir: &Path, root: &Path, files: &mut Vec<(PathBuf, usize)>) -> Result<()> {
    for path in read_dir_sorted(dir)? {
        if path.is_dir() {
            collect(src, &path, root, files)?;
            continue;
        }
        let in_src = path.strip_prefix(src).unwrap_or(&path);
        if !is_non_test_source(in_src) {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        files.push((relative, text.lines().count()));
    }
    Ok(())
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    paths.sort();
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, usize)]) -> Vec<(PathBuf, usize)> {
        list.iter().map(|(p, n)| (PathBuf::from(p), *n)).collect()
    }

    #[test]
    fn only_files_past_the_limit_are_reported_longest_first() {
        let files = pairs(&[
            ("a/src/at_limit.rs", 600),
            ("a/src/one_over.rs", 601),
            ("b/src/much_longer.rs", 900),
            ("b/src/short.rs", 12),
        ]);
        assert_eq!(
            over_limit(&files, 600),
            pairs(&[("b/src/much_longer.rs", 900), ("a/src/one_over.rs", 601)])
        );
        assert!(over_limit(&files, 900).is_empty());
    }

    #[test]
    fn test_bench_and_example_files_are_not_source() {
        for source in [
            "lib.rs",
            "kernels/matmul.rs",
            "bin/plimsoll/main.rs",
            "contests.rs",
        ] {
            assert!(is_non_test_source(Path::new(source)), "{source}");
        }
        for not_source in [
            "tests.rs",
            "free_index_tests.rs",
            "kernels/tests.rs",
            "tests/helpers.rs",
            "benches/alloc.rs",
            "examples/demo.rs",
            "ops/tests/grad.rs",
            "notes.md",
        ] {
            assert!(!is_non_test_source(Path::new(not_source)), "{not_source}");
        }
    }

    /// A throwaway workspace under the system temp directory, removed on drop.
    struct TempWorkspace(PathBuf);

    impl TempWorkspace {
        fn new(name: &str) -> Result<Self> {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos();
            let dir =
                std::env::temp_dir().join(format!("xtask-{name}-{}-{nanos}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            Ok(Self(dir))
        }

        fn write(&self, relative: &str, lines: usize) -> Result<()> {
            let path = self.0.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, "// line\n".repeat(lines))?;
            Ok(())
        }
    }

    impl Drop for TempWorkspace {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_walk_counts_crate_sources_and_skips_tests() -> Result<()> {
        let ws = TempWorkspace::new("line-limit")?;
        ws.write("Cargo.toml", 3)?;
        ws.write("krate/Cargo.toml", 3)?;
        ws.write("krate/src/lib.rs", 10)?;
        ws.write("krate/src/too_long.rs", WARN_LINES + 1)?;
        ws.write("krate/src/deep/module.rs", WARN_LINES)?;
        ws.write("krate/src/tests.rs", 2 * WARN_LINES)?;
        ws.write("krate/src/thing_tests.rs", 2 * WARN_LINES)?;
        ws.write("krate/src/tests/big.rs", 2 * WARN_LINES)?;
        ws.write("krate/tests/integration.rs", 2 * WARN_LINES)?;
        ws.write("krate/benches/bench.rs", 2 * WARN_LINES)?;
        // Not a crate (no Cargo.toml): not walked.
        ws.write("notes/src/long.rs", 2 * WARN_LINES)?;

        let counts = line_counts(&ws.0)?;
        assert_eq!(
            counts,
            pairs(&[
                ("krate/src/deep/module.rs", WARN_LINES),
                ("krate/src/lib.rs", 10),
                ("krate/src/too_long.rs", WARN_LINES + 1),
            ])
        );
        let found = warnings(&ws.0)?;
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains(&format!(
                "krate/src/too_long.rs has {} lines",
                WARN_LINES + 1
            )),
            "{found:?}"
        );

        std::fs::remove_file(ws.0.join("krate/src/too_long.rs"))?;
        assert!(warnings(&ws.0)?.is_empty());
        Ok(())
    }
}
