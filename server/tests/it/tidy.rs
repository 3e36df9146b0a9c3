//! Repository hygiene: every Rust file says what it is for, and libraries hold no debugging
//! leftovers or stdout printing.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("server/ has a parent")
        .to_path_buf()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        // `vendor/` is third-party code, kept as its authors wrote it.
        if name == "target" || name == "vendor" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

fn all_rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&workspace_root(), &mut files);
    assert!(files.len() > 20, "the walk found the sources: {files:?}");
    files
}

#[test]
fn every_rust_file_starts_with_a_module_doc_line() {
    let missing: Vec<String> = all_rust_files()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            !text.starts_with("//!")
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading //! line: {missing:?}"
    );
}

#[test]
fn libraries_hold_no_debugging_leftovers_or_stdout_printing() {
    // Library code writes to stdout only through explicit writers (resctl: `output::print`).
    // Built from pieces so this file does not match itself.
    let forbidden = [
        concat!("db", "g!("),
        concat!("to", "do!("),
        concat!("print", "ln!("),
    ];
    let offenders: Vec<String> = all_rust_files()
        .into_iter()
        .filter(|path| {
            let text = path.to_string_lossy();
            // Binaries (examples too) own stdout; tests, benchmarks and build scripts may print.
            !(text.ends_with("main.rs")
                || text.ends_with("build.rs")
                || text.contains("/tests")
                || text.contains("/benches/")
                || text.contains("/examples/"))
        })
        .filter_map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            // `eprintln!` is fine: resctl's command modules talk to people on stderr.
            let hits: Vec<&str> = forbidden
                .iter()
                .copied()
                .filter(|pattern| {
                    text.match_indices(pattern)
                        .any(|(at, _)| !text[..at].ends_with('e'))
                })
                .collect();
            (!hits.is_empty()).then(|| format!("{}: {hits:?}", path.display()))
        })
        .collect();
    assert!(offenders.is_empty(), "{offenders:?}");
}

/// Files of one server module (its `NAME.rs` and everything under `NAME/`).
fn module_files(name: &str) -> Vec<PathBuf> {
    let src = workspace_root().join("server/src");
    let mut files = vec![src.join(format!("{name}.rs"))];
    rust_files(&src.join(name), &mut files);
    files
}

/// Every module of the server library, lowest first, and what it may never import: a new
/// module must be placed here (`every_module_has_a_place`).
const LAYERS: &[(&str, &[&str])] = &[
    // The pure rules of ids, names and finalizers: nothing of the crate.
    (
        "resource",
        &[
            "crate::acl",
            "crate::tls",
            "crate::registry",
            "crate::storage",
            "crate::service",
            "crate::controller",
            "crate::agent",
            "crate::http",
            "crate::metrics",
            "crate::limits",
            "crate::cluster",
            "crate::wire",
        ],
    ),
    // Policies, rules and tokens: only `resource`.
    (
        "acl",
        &[
            "crate::tls",
            "crate::registry",
            "crate::storage",
            "crate::service",
            "crate::controller",
            "crate::agent",
            "crate::http",
            "crate::metrics",
            "crate::limits",
            "crate::cluster",
            "crate::wire",
        ],
    ),
    // Certificates and connections: below everything that dials or serves.
    (
        "tls",
        &[
            "crate::registry",
            "crate::storage",
            "crate::service",
            "crate::agent",
            "crate::controller",
            "crate::acl",
            "crate::cluster",
        ],
    ),
    // Instruments: below storage.
    (
        "metrics",
        &[
            "crate::storage",
            "crate::service",
            "crate::agent",
            "crate::controller",
            "crate::http",
            "crate::cluster",
        ],
    ),
    (
        "limits",
        &[
            "crate::agent",
            "crate::controller",
            "crate::http",
            "crate::cluster",
        ],
    ),
    // The audit log: under everything that serves.
    (
        "audit",
        &[
            "crate::registry",
            "crate::storage",
            "crate::service",
            "crate::agent",
            "crate::controller",
            "crate::http",
            "crate::cluster",
            "crate::wire",
        ],
    ),
    (
        "registry",
        &[
            "crate::service",
            "crate::storage",
            "crate::agent",
            "crate::cluster",
        ],
    ),
    // Bytes written by hand: below everything that serves.
    (
        "wire",
        &[
            "crate::service",
            "crate::agent",
            "crate::controller",
            "crate::http",
            "crate::cluster",
        ],
    ),
    // The storage contract and its backends: membership is above it.
    (
        "storage",
        &[
            "crate::service",
            "crate::agent",
            "crate::controller",
            "crate::http",
            "crate::cluster",
        ],
    ),
    // Membership of the raft group: over the node, under the services.
    (
        "cluster",
        &[
            "crate::service",
            "crate::agent",
            "crate::controller",
            "crate::http",
        ],
    ),
    (
        "service",
        &["crate::agent", "crate::controller", "crate::http"],
    ),
    // Controllers reach the service, never the agent or the HTTP server.
    ("controller", &["crate::agent", "crate::http"]),
    ("http", &["crate::agent", "crate::controller"]),
    // The composition root: one running node, assembled from the above.
    ("agent", &[]),
];

#[test]
fn lower_layers_never_import_upper_ones() {
    let mut offenders = Vec::new();
    for (module, upper) in LAYERS {
        for path in module_files(module) {
            // Code, not what the comments say about other rooms.
            let text: String = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for pattern in *upper {
                if text.contains(pattern) {
                    offenders.push(format!("{} uses {pattern}", path.display()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:?}");
}

#[test]
fn every_module_has_a_place() {
    let lib = std::fs::read_to_string(workspace_root().join("server/src/lib.rs")).expect("lib.rs");
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|line| line.trim().strip_suffix(';'))
        .filter_map(|line| line.rsplit_once("mod ").map(|(_, name)| name))
        .collect();
    assert!(modules.len() > 10, "{modules:?}");
    let placed: Vec<&str> = LAYERS.iter().map(|(module, _)| *module).collect();
    let unplaced: Vec<&&str> = modules.iter().filter(|m| !placed.contains(m)).collect();
    assert!(
        unplaced.is_empty(),
        "modules the layering does not place: {unplaced:?}"
    );
}

/// Non-test code of the server library, as (path, text) — test files, and everything after a
/// file's `#[cfg(test)]`, left out.
fn server_code() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("server/src"), &mut files);
    files
        .into_iter()
        .filter(|path| !path.ends_with("tests.rs") && !path.to_string_lossy().contains("/tests/"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let code = text
                .lines()
                .take_while(|line| !line.contains("#[cfg(test)]"))
                .collect::<Vec<_>>()
                .join("\n");
            (path, code)
        })
        .collect()
}

/// The rules that say one room alone knows something, each checked.
#[test]
fn only_one_room_knows_each_thing() {
    let server = workspace_root().join("server/src");
    // (what, the pattern, the files or directories that alone may hold it)
    let rules: &[(&str, &str, &[&str])] = &[
        (
            "only the cluster room changes membership",
            "change_membership(",
            &["cluster"],
        ),
        (
            "only the cluster room adds learners",
            "add_learner(",
            &["cluster"],
        ),
        (
            "only the wire room writes protobuf by hand",
            "prost::encoding::",
            &["wire"],
        ),
        (
            "only the wire room writes openraft's values",
            "impl Wire for",
            &["wire"],
        ),
        (
            "only the wire room names the on-disk format",
            "const FORMAT",
            &["wire.rs"],
        ),
        (
            "only service::error attaches reasons to statuses",
            "reason::attach(",
            &["service/error.rs"],
        ),
        (
            "only the storage codec converts raft values to protobuf",
            "fn command_of(",
            &["storage/raft/codec.rs"],
        ),
    ];
    let mut offenders = Vec::new();
    for (path, code) in server_code() {
        let relative = path
            .strip_prefix(&server)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        for (rule, pattern, rooms) in rules {
            let inside = rooms.iter().any(|room| {
                relative == *room
                    || relative.starts_with(&format!("{room}/"))
                    || relative == format!("{room}.rs")
            });
            if !inside && code.contains(pattern) {
                offenders.push(format!("{rule}: {relative} has {pattern:?}"));
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

/// Clients decide on reasons, never on a server's words (DESIGN §3, "Errors"): the phrases
/// failover and retries once looked for appear in no client's code.
#[test]
fn no_client_decides_on_the_servers_words() {
    let phrases = [
        "shutting down",
        "catching up",
        "was removed",
        "membership is unchanged",
        "not committed",
        "namespace not found",
        "partition not found",
        "is not registered",
        "quorum",
    ];
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["proto/src/client", "runtime/src", "ctl/src", "tui/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.push(root.join("proto/src/client.rs"));
    let mut offenders = Vec::new();
    for path in files {
        if path.ends_with("tests.rs") || path.to_string_lossy().contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // Tests may say the words (to show they drive nothing); so may comments.
        let code: String = text
            .lines()
            .take_while(|line| !line.contains("#[cfg(test)]"))
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for phrase in phrases {
            let decisions = [
                format!(".contains(\"{phrase}"),
                format!("starts_with(\"{phrase}"),
                format!("== \"{phrase}"),
            ];
            if decisions
                .iter()
                .any(|decision| code.contains(decision.as_str()))
            {
                offenders.push(format!("{}: {phrase:?}", path.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "decisions on words: {offenders:?}");
}
