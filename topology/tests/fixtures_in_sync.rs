//! The committed trees under `tests/fixtures/sysfs/` must be exactly what
//! `support/fixtures.rs` generates, so that the code that documents a
//! fixture and the bytes the tests read cannot drift apart.
//!
//! To regenerate after changing a fixture:
//! `BARLINK_REGENERATE_FIXTURES=1 cargo test -p barlink-topology --test fixtures_in_sync`

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use support::{TempDir, fixtures};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs")
}

#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
}

/// Every entry under `root`, without following links.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut entries = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read fixture dir") {
            let entry = entry.expect("dir entry");
            let path = entry.path();
            let relative = path.strip_prefix(root).expect("under root").to_path_buf();
            let file_type = entry.file_type().expect("file type");
            if file_type.is_symlink() {
                entries.insert(
                    relative,
                    Entry::Link(fs::read_link(&path).expect("read link")),
                );
            } else if file_type.is_dir() {
                entries.insert(relative, Entry::Dir);
                stack.push(path);
            } else {
                entries.insert(relative, Entry::File(fs::read(&path).expect("read file")));
            }
        }
    }
    entries
}

#[test]
fn committed_fixtures_match_the_generator() {
    let regenerate = std::env::var_os("BARLINK_REGENERATE_FIXTURES").is_some();
    for (name, build) in fixtures::ALL {
        let committed = fixture_dir().join(name);
        if regenerate {
            let _ = fs::remove_dir_all(&committed);
            build(&committed);
            continue;
        }
        let generated = TempDir::new(name);
        build(generated.path());
        let want = snapshot(generated.path());
        let have = snapshot(&committed);
        let missing: Vec<_> = want.keys().filter(|k| !have.contains_key(*k)).collect();
        let extra: Vec<_> = have.keys().filter(|k| !want.contains_key(*k)).collect();
        let differing: Vec<_> = want
            .iter()
            .filter(|(k, v)| have.get(*k).is_some_and(|h| h != *v))
            .map(|(k, _)| k)
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && differing.is_empty(),
            "fixture {name} is out of date (missing {missing:?}, extra {extra:?}, differing {differing:?}); regenerate with BARLINK_REGENERATE_FIXTURES=1"
        );
    }
}
