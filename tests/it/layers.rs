//! The source tree keeps the shape docs/development.md ("The parts") gives it: `src/` holds
//! `main.rs`, `lib.rs` and exactly the subsystem folders of that table; a folder uses only the
//! folders the table lists before it (never `lib.rs`); no file of `src/`, `sim/src/` or
//! `dev/src/` imports another that imports it back, directly or around a circle; every folder's
//! `mod.rs` is its front door (docs naming every file, `mod` and `use` lines, no code) and the
//! table names every file too; and the comments of `src/` and `sim/src/` say what and why, not
//! which issue, date or benchmark run a line came from.
//!
//! Imports are read as text: `use` statements (braces expanded) and `crate::`, `super::`,
//! `self::` and child-module paths in code, each resolved to the deepest module file it names.
//! Comments and `#[cfg(test)]` modules are left out. Standard library only: no build of the
//! product is needed (`rustc --edition 2024 --test tests/it/layers.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every module file below `root` (a crate's `src/`), by module path (`[]` is `lib.rs`).
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("source folder is readable") {
            let path = entry.expect("source entry is readable").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).expect("below root");
            let mut module: Module = rel
                .iter()
                .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            // main.rs is a crate of its own (the binary); it imports through `relaylet::`.
            if rel == Path::new("main.rs") {
                continue;
            }
            found.insert(module, path);
        }
    }
    found
}

/// The code of a file: without comments and without its `#[cfg(test)]` modules.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            skip_block(&mut lines);
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let without_comment = match line.find(" // ") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(without_comment);
        out.push('\n');
    }
    out
}

/// Skips the lines of the block that starts on the next line (up to its closing brace).
fn skip_block<'a>(lines: &mut std::iter::Peekable<impl Iterator<Item = &'a str>>) {
    let mut depth = 0i32;
    let mut opened = false;
    for line in lines.by_ref() {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return;
        }
        if !opened && line.trim_end().ends_with(';') {
            return; // `mod tests;`
        }
    }
}

/// The paths a `use` tree names, braces expanded: `a::{b, c::{d, self}}` gives `a::b`,
/// `a::c::d` and `a::c`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("");
        return vec![path.split_whitespace().collect()];
    };
    let prefix: String = tree[..open].split_whitespace().collect();
    let prefix = prefix.trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    let mut out = Vec::new();
    for part in parts.into_iter().filter(|p| !p.trim().is_empty()) {
        for sub in expand(part) {
            out.push(match sub.as_str() {
                "self" => prefix.to_string(),
                _ if prefix.is_empty() => sub,
                _ => format!("{prefix}::{sub}"),
            });
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths the code names: every `use` tree, and every `a::b::c` outside them.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code.to_string();
    // `use` statements, possibly over several lines.
    while let Some(at) = find_use(&rest) {
        let end = rest[at..].find(';').map_or(rest.len(), |e| at + e);
        // A re-export names a folder's face; what uses the item depends on it, not the folder.
        let line_start = rest[..at].rfind('\n').map_or(0, |n| n + 1);
        if !rest[line_start..at].trim_start().starts_with("pub") {
            out.extend(expand(&rest[at + "use ".len()..end]));
        }
        rest.replace_range(at..end, "");
    }
    // Paths in code.
    let chars: Vec<char> = rest.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if is_ident(chars[i]) && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':')) {
            let start = i;
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == ':') {
                i += 1;
            }
            let path: String = chars[start..i].iter().collect();
            if path.contains("::") {
                out.push(path.trim_end_matches(':').to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where the next `use` statement starts.
fn find_use(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = code[from..].find("use ") {
        let at = from + found;
        let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
        let before = code[line_start..at].trim();
        if before.is_empty() || before.starts_with("pub") {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// The module file a path in `module` names, if it names one of this crate's modules.
fn resolve(path: &str, module: &Module, known: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut base, rest): (Module, &[&str]) = match segments.first().copied()? {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (module.clone(), &segments[1..]),
        "super" => {
            let mut base = module.clone();
            let mut rest = &segments[..];
            while rest.first() == Some(&"super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        child => {
            let mut candidate = module.clone();
            candidate.push(child.to_string());
            if !known.contains_key(&candidate) {
                return None;
            }
            (module.clone(), &segments[..])
        }
    };
    let mut target = base.clone();
    for segment in rest {
        base.push((*segment).to_string());
        if known.contains_key(&base) {
            target = base.clone();
        } else {
            break;
        }
    }
    known.contains_key(&target).then_some(target)
}

/// Each module's imports of other modules of the same crate.
fn imports(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let known = modules(root);
    let mut graph = BTreeMap::new();
    for (module, file) in &known {
        let text = fs::read_to_string(file).expect("source file is readable");
        let targets: BTreeSet<Module> = paths(&code(&text))
            .iter()
            .filter_map(|path| resolve(path, module, &known))
            .filter(|target| target != module)
            .collect();
        graph.insert(module.clone(), targets);
    }
    graph
}

fn show(module: &Module) -> String {
    if module.is_empty() {
        "lib.rs".to_string()
    } else {
        module.join("::")
    }
}

/// The circles of `graph`: its strongly connected components of more than one module.
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    let reaches = |from: &Module| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&Module, BTreeSet<Module>> =
        graph.keys().map(|m| (m, reaches(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in graph.keys() {
        if done.contains(m) || !reach[m].contains(m) {
            continue;
        }
        let circle: Vec<String> = graph
            .keys()
            .filter(|other| reach[m].contains(*other) && reach[*other].contains(m))
            .inspect(|other| {
                done.insert((*other).clone());
            })
            .map(show)
            .collect();
        out.push(circle);
    }
    out
}

/// The entries of docs/development.md's folder table, in order (`config.rs` as `config`).
fn documented_layers() -> Vec<String> {
    let doc = fs::read_to_string(repo().join("docs/development.md")).expect("development.md");
    let table = doc
        .split("| folder | what it is for; its files |")
        .nth(1)
        .expect("development.md has the folder table");
    table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with("| `"))
        .map(|line| {
            let name = line[3..].split('`').next().unwrap_or("");
            name.trim_end_matches('/')
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect()
}

#[test]
fn src_holds_the_documented_folders_and_little_else() {
    let layers = documented_layers();
    let mut entries: Vec<String> = fs::read_dir(repo().join("src"))
        .expect("src/")
        .map(|e| {
            let name = e.expect("entry").file_name().to_string_lossy().to_string();
            name.trim_end_matches(".rs").to_string()
        })
        .collect();
    entries.sort();
    let mut expected: Vec<String> = layers.clone();
    expected.extend(["lib".to_string(), "main".to_string()]);
    expected.sort();
    assert_eq!(
        entries, expected,
        "src/ and the folder table of docs/development.md differ"
    );
    // A dozen subsystems and the command line at most: a newcomer reads the tree at a glance.
    assert!(
        entries.len() <= 16,
        "{} entries at the top of src/",
        entries.len()
    );
}

#[test]
fn each_folder_uses_only_the_folders_before_it() {
    let layers = documented_layers();
    let rank = |module: &Module| {
        module
            .first()
            .and_then(|top| layers.iter().position(|layer| layer == top))
    };
    let mut upward = Vec::new();
    for (module, targets) in imports(&repo().join("src")) {
        let Some(own) = rank(&module) else { continue }; // lib.rs wires everything
        for target in targets {
            match rank(&target) {
                Some(theirs) if theirs <= own => {}
                _ => upward.push(format!("{} -> {}", show(&module), show(&target))),
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the order of docs/development.md's folder table:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_import_circles_in_src_sim_or_dev() {
    for root in ["src", "sim/src", "dev/src"] {
        let graph = imports(&repo().join(root));
        let edges: usize = graph.values().map(BTreeSet::len).sum();
        // The reader must see the imports at all, or an empty graph would pass.
        assert!(edges > graph.len(), "{root}: only {edges} imports read");
        let found = circles(&graph);
        assert!(found.is_empty(), "{root}: import circles: {found:?}");
    }
}

#[test]
fn the_reader_sees_what_it_must() {
    let text = "use crate::a::{b, c::{self, D}};\nuse super::e;\n// use crate::x;\nfn f() { crate::g::h(); child::i(); }\n#[cfg(test)]\nmod tests {\n    use crate::y;\n}\n";
    let known: BTreeMap<Module, PathBuf> = [
        vec!["a".to_string()],
        vec!["a".to_string(), "b".to_string()],
        vec!["a".to_string(), "c".to_string()],
        vec!["m".to_string()],
        vec!["m".to_string(), "child".to_string()],
        vec!["e".to_string()],
        vec!["g".to_string()],
        vec!["x".to_string()],
        vec!["y".to_string()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let module = vec!["m".to_string()];
    let got: BTreeSet<String> = paths(&code(text))
        .iter()
        .filter_map(|p| resolve(p, &module, &known))
        .map(|m| show(&m))
        .collect();
    // `super::e` from `m` is the crate root's `e`; `x` and `y` are in a comment and a test module.
    let want: BTreeSet<String> = ["a::b", "a::c", "e", "g", "m::child"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(got, want);
}

/// Every folder below `root` that has a `mod.rs`, with its child modules (files and folders).
fn folders(root: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let mut children = Vec::new();
        for entry in fs::read_dir(&dir).expect("source folder is readable") {
            let path = entry.expect("source entry is readable").path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if path.is_dir() {
                dirs.push(path);
                children.push(name);
            } else if let Some(stem) = name.strip_suffix(".rs")
                && stem != "mod"
            {
                children.push(stem.to_string());
            }
        }
        if dir.join("mod.rs").exists() {
            children.sort();
            out.push((dir, children));
        }
    }
    out.sort();
    out
}

/// The `//!` lines at the top of a file, joined.
fn module_doc(text: &str) -> String {
    text.lines()
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_folder_names_its_files_in_its_front_door_and_the_table() {
    let doc = fs::read_to_string(repo().join("docs/development.md")).expect("development.md");
    let mut missing = Vec::new();
    for (dir, children) in folders(&repo().join("src")) {
        let shown = dir
            .strip_prefix(repo())
            .unwrap_or(&dir)
            .display()
            .to_string();
        let text = fs::read_to_string(dir.join("mod.rs")).expect("mod.rs");
        let front = module_doc(&text);
        // The table row of a top-level folder (`src/<folder>`).
        let row = dir
            .parent()
            .is_some_and(|p| p == repo().join("src"))
            .then(|| {
                let name = dir.file_name().unwrap_or_default().to_string_lossy();
                doc.lines()
                    .find(|l| l.starts_with(&format!("| `{name}/` |")))
                    .unwrap_or("")
                    .to_string()
            });
        for child in children {
            let quoted = format!("`{child}`");
            if !front.contains(&quoted) {
                missing.push(format!("{shown}/mod.rs does not name {quoted}"));
            }
            if let Some(row) = &row
                && !row.contains(&quoted)
            {
                missing.push(format!(
                    "docs/development.md's row for {shown} does not name {quoted}"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The lines of a `mod.rs` that are neither `mod` nor `use` lines (nor attributes).
fn front_door_code(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_use = false;
    for line in code(text).lines().map(str::trim).filter(|l| !l.is_empty()) {
        let allowed = in_use
            || line.starts_with("#[")
            || line.starts_with("#![")
            || ["mod ", "pub mod ", "pub(crate) mod ", "use ", "pub use "]
                .iter()
                .any(|start| line.starts_with(start));
        if !allowed {
            out.push(line.to_string());
        }
        // A `use` over several lines goes on until its `;`.
        in_use = (in_use || line.starts_with("use ") || line.starts_with("pub use "))
            && !line.ends_with(';');
    }
    out
}

#[test]
fn a_folders_mod_rs_holds_no_code() {
    let mut found = Vec::new();
    for (dir, _) in folders(&repo().join("src")) {
        let text = fs::read_to_string(dir.join("mod.rs")).expect("mod.rs");
        for line in front_door_code(&text) {
            found.push(format!("{}/mod.rs: {line}", dir.display()));
        }
    }
    assert!(
        found.is_empty(),
        "a folder's mod.rs declares its files and re-exports what it offers; code belongs in a file:\n{}",
        found.join("\n")
    );
}

/// What a comment must not cite: where a line came from belongs to git, a figure to
/// docs/performance.md.
const HISTORY: [&str; 6] = [
    "issue ",
    "as before",
    "relaylet-dev bench",
    "measured on",
    "Nov 2",
    "2026-",
];

#[test]
fn comments_say_what_and_why_not_where_from() {
    let mut found = Vec::new();
    for root in ["src", "sim/src"] {
        for file in modules(&repo().join(root)).values() {
            let text = fs::read_to_string(file).expect("source file is readable");
            for (n, line) in text.lines().enumerate() {
                let Some(at) = line.find("//") else { continue };
                let comment = line[at..].to_ascii_lowercase();
                if let Some(cited) = HISTORY
                    .iter()
                    .find(|h| comment.contains(&h.to_ascii_lowercase()))
                {
                    found.push(format!("{}:{}: {cited:?}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checks_see_what_they_must() {
    // A front door with code, and a comment citing its history, are both found.
    let text =
        "//! Docs.\n\nmod a;\n#[cfg(test)]\nmod tests;\npub use a::{\n    B,\n};\nfn helper() {}\n";
    assert_eq!(front_door_code(text), ["fn helper() {}"]);
    assert_eq!(module_doc(text), "//! Docs.");
    assert!(
        HISTORY
            .iter()
            .any(|h| "// as before, see issue 37".contains(h))
    );
}
