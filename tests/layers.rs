//! The source's folders are layers, and a module imports only from its own layer or the
//! layers below it (ARCHITECTURE.md). This test reads every file under `src/`, finds each
//! `crate::…` and `super::…` path in it (use statements and inline paths, comments
//! excluded), maps the path to the layer it names and fails with the list of imports that go
//! up. A name re-exported at the crate root (`crate::Engine`) counts as the layer that
//! defines it, read from `src/lib.rs`'s `pub use` block.
//!
//! `cargo test --test layers -- --nocapture` prints the layer table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The layers from the bottom up. A layer may import from the layers listed in its `may`.
struct Layer {
    name: &'static str,
    may: &'static [&'static str],
    owns: &'static str,
}

const LAYERS: &[Layer] = &[
    Layer {
        name: "base",
        may: &[],
        owns: "time and clocks, the sync shim, hashing, limits, test-only switches",
    },
    Layer {
        name: "model",
        may: &["base"],
        owns: "the pure state machine, records and their encoding, errors, settings",
    },
    Layer {
        name: "store",
        may: &["base", "model"],
        owns: "the redb file, the commit log, the storage trait, the store's config",
    },
    Layer {
        name: "index",
        may: &["base", "model", "store"],
        owns: "stripes, expiry order, publication marks, wake-ups, counters",
    },
    Layer {
        name: "runtime",
        may: &["base", "model", "store", "index"],
        owns: "shared state, the queue, writer, applier, recovery, sweeper, timers",
    },
    Layer {
        name: "api",
        may: &["base", "model", "store", "index", "runtime"],
        owns: "Engine, builder and options, leases, admin, outbox, reader, async API",
    },
    Layer {
        name: "http",
        may: &["base", "model", "api"],
        owns: "the Idempotency-Key layer for tower services (feature http)",
    },
    Layer {
        name: "shared",
        may: &["base", "model", "api"],
        owns: "the shared backend over PostgreSQL (feature postgres)",
    },
];

/// One import against the layer order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    file: String,
    from: String,
    to: String,
    path: String,
}

fn layer(name: &str) -> Option<&'static Layer> {
    LAYERS.iter().find(|l| l.name == name)
}

/// Whether a module of layer `from` may import from layer `to`.
fn allowed(from: &str, to: &str) -> bool {
    from == to || layer(from).is_some_and(|l| l.may.contains(&to))
}

/// The source with its comments removed (line comments, doc comments, block comments).
/// String literals are kept as they are: a `//` inside one (a URL) cuts the rest of its line,
/// which holds no import.
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that starts with `crate::` or `super::` in `src`, as its segments after the
/// prefix; `supers` is how many `super::` it starts with (0 for `crate::`). A brace group
/// (`crate::{a::X, b}`) gives one path per item.
fn paths(src: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let bytes = src.as_bytes();
    let mut i = 0;
    while i < src.len() {
        let boundary = i == 0 || !ident_char(bytes[i - 1] as char) && bytes[i - 1] != b':';
        let rest = &src[i..];
        let (supers, after) = if boundary && rest.starts_with("crate::") {
            (0, &rest["crate::".len()..])
        } else if boundary && rest.starts_with("super::") {
            let mut n = 0;
            let mut r = rest;
            while let Some(a) = r.strip_prefix("super::") {
                n += 1;
                r = a;
            }
            (n, r)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find(';').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let segs = segments(item.trim().trim_start_matches('{'));
                if !segs.is_empty() {
                    found.push((supers, segs));
                }
            }
        } else {
            let segs = segments(after);
            if !segs.is_empty() {
                found.push((supers, segs));
            }
        }
        i = src.len() - after.len();
    }
    found
}

/// The leading `a::b::c` segments of `s`.
fn segments(s: &str) -> Vec<String> {
    let mut segs = Vec::new();
    let mut rest = s;
    loop {
        let end = rest.find(|c: char| !ident_char(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segs.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    segs
}

/// The layer of each name `lib.rs` re-exports (`pub use crate::api::engine::Engine;` gives
/// `Engine` → `api`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for stmt in strip_comments(lib).split(';') {
        let Some(at) = stmt.find("pub use crate::") else {
            continue;
        };
        let path = &stmt[at + "pub use crate::".len()..];
        let Some(layer) = segments(path).first().cloned() else {
            continue;
        };
        let items = match (path.find('{'), path.rfind('}')) {
            (Some(a), Some(b)) => path[a + 1..b].to_string(),
            _ => path.rsplit("::").next().unwrap_or("").to_string(),
        };
        for item in items.split(',') {
            let name = item.trim().rsplit(" as ").next().unwrap_or("").trim();
            if !name.is_empty() {
                names.insert(name.to_string(), layer.clone());
            }
        }
    }
    names
}

/// The layer a file belongs to: its top folder under `src/` (`None` for `lib.rs`).
fn layer_of(rel: &str) -> Option<&str> {
    rel.split_once('/').map(|(top, _)| top)
}

/// The imports of one file (`rel`, relative to `src/`) that go against the order.
fn check_file(rel: &str, src: &str, roots: &BTreeMap<String, String>) -> Vec<Violation> {
    let Some(from) = layer_of(rel) else {
        return Vec::new();
    };
    // The file's module path: `api/engine.rs` is api::engine, `api/mod.rs` is api.
    let mut module: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
    if module.last() == Some(&"mod") {
        module.pop();
    }
    let mut out = Vec::new();
    for (supers, segs) in paths(&strip_comments(src)) {
        let first = if supers == 0 {
            segs.first().map(String::as_str)
        } else if supers < module.len() {
            Some(module[0])
        } else if supers == module.len() {
            segs.first().map(String::as_str)
        } else {
            None
        };
        let Some(first) = first else { continue };
        let to = if layer(first).is_some() {
            first.to_string()
        } else if let Some(l) = roots.get(first) {
            l.clone()
        } else {
            continue;
        };
        if !allowed(from, &to) {
            let prefix = if supers == 0 {
                "crate::".to_string()
            } else {
                "super::".repeat(supers)
            };
            out.push(Violation {
                file: rel.to_string(),
                from: from.to_string(),
                to,
                path: format!("{prefix}{}", segs.join("::")),
            });
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_import_follows_the_layer_order() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let roots = reexports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);

    let mut per_layer: BTreeMap<&str, usize> = BTreeMap::new();
    let mut strays = Vec::new();
    let mut violations = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        match layer_of(&rel) {
            None if rel == "lib.rs" => {}
            Some(l) if layer(l).is_some() => {
                *per_layer
                    .entry(layer(l).expect("a layer").name)
                    .or_default() += 1
            }
            _ => strays.push(rel.clone()),
        }
        let text = std::fs::read_to_string(path).expect("a source file");
        violations.extend(check_file(&rel, &text, &roots));
    }
    assert!(
        strays.is_empty(),
        "files outside the layer folders (only lib.rs sits at src/): {strays:?}"
    );

    violations.sort();
    violations.dedup();
    let mut report = String::new();
    for v in &violations {
        let _ = writeln!(
            report,
            "  src/{}: {} -> {} ({})",
            v.file, v.from, v.to, v.path
        );
    }
    assert!(
        violations.is_empty(),
        "{} imports go against the layer order (a layer imports only from itself and the \
         layers it lists):\n{report}",
        violations.len()
    );
    println!("layer    files  may import                       owns");
    for l in LAYERS.iter().rev() {
        println!(
            "{:<8} {:>5}  {:<32} {}",
            l.name,
            per_layer.get(l.name).copied().unwrap_or(0),
            if l.may.is_empty() {
                "-".to_string()
            } else {
                l.may.join(",")
            },
            l.owns
        );
    }
    println!(
        "{} files checked, every import follows the order",
        files.len()
    );
}

#[test]
fn the_checker_catches_an_upward_import() {
    let roots =
        reexports("pub use crate::api::engine::{Engine, Other};\npub use crate::model::x::Y;");
    assert_eq!(roots.get("Engine").map(String::as_str), Some("api"));
    assert_eq!(roots.get("Y").map(String::as_str), Some("model"));

    let bad = "use crate::base::clock::Time;\n\
               use crate::api::engine::Engine; // up\n\
               fn f() { crate::runtime::writer::spawn(); }\n\
               use crate::{Engine, Y};\n\
               // use crate::api::lease::Lease; a comment is no import\n";
    let found = check_file("model/bad.rs", bad, &roots);
    let paths: Vec<_> = found.iter().map(|v| v.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "crate::api::engine::Engine",
            "crate::runtime::writer::spawn",
            "crate::Engine"
        ]
    );
    assert!(found.iter().all(|v| v.from == "model"));

    // Siblings may not import each other; `super::` from a folder's mod.rs is the root.
    let sibling = "use super::shared::Backend;\nuse super::api::engine::Engine;\n";
    let found = check_file("http/mod.rs", sibling, &roots);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].to, "shared");

    // Same-layer and downward imports pass; `super::` within a folder stays in its layer.
    let fine = "use super::engine::Engine;\nuse crate::runtime::writer;\nuse crate::Y;\n";
    assert!(check_file("api/lease.rs", fine, &roots).is_empty());
}
