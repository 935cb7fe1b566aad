//! The user documentation holds together: every relative Markdown link in README.md and docs/*.md
//! names a file that exists and, with an `#anchor`, a heading that file has (GitHub's slugs), and
//! README.md stays short and starts with the two commands. Standard library only: no build of the
//! product is needed to run it (`rustc --edition 2024 --test tests/it/docs_links.rs`).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// How README.md starts, exactly: the title and the two commands.
const README_START: &str = "# relaylet

```sh
cargo run --release -p relaylet-dev -- sandbox   # simulated root + leaf clusters with the real \
relaylet between them, for your kubectl
bash .ci/run                                     # the whole test suite, exactly as CI runs it
```

The first command prints `relaylet-dev sandbox ready ...`";

const README_MAX_LINES: usize = 300;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, sorted.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = fs::read_dir(repo().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("docs/ is readable").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    let mut all = vec![repo().join("README.md")];
    all.extend(docs);
    all
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Whether a line opens or closes a fenced code block (``` or ~~~, indented or not).
fn is_fence(line: &str) -> bool {
    let trimmed = line.trim_start();
    trimmed.starts_with("```") || trimmed.starts_with("~~~")
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if is_fence(line) {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            out.push((i + 1, line));
        }
    }
    out
}

/// The line with inline code spans blanked out (a run of n backticks up to the next run of
/// exactly n); an unmatched run stays as it is.
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                if other == run {
                    close = Some(j);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.extend(std::iter::repeat_n(' ', end + run - i));
                i = end + run;
            }
            None => {
                out.extend(std::iter::repeat_n('`', run));
                i += run;
            }
        }
    }
    out
}

/// The index just past the bracket that closes the one at `open`, if any.
fn closing(chars: &[char], open: usize, left: char, right: char) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            i += 2;
            continue;
        }
        if c == left {
            depth += 1;
        } else if c == right {
            depth -= 1;
            if depth == 0 {
                return Some(i + 1);
            }
        }
        i += 1;
    }
    None
}

/// Every inline link `[text](target)` of a line (code spans already removed): (text, target).
fn links(line: &str) -> Vec<(String, String)> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] != '[' {
            i += 1;
            continue;
        }
        let Some(after_text) = closing(&chars, i, '[', ']') else {
            i += 1;
            continue;
        };
        if chars.get(after_text) != Some(&'(') {
            i += 1;
            continue;
        }
        let Some(after_target) = closing(&chars, after_text, '(', ')') else {
            i += 1;
            continue;
        };
        let text: String = chars[i + 1..after_text - 1].iter().collect();
        let inside: String = chars[after_text + 1..after_target - 1].iter().collect();
        // A title may follow the target: [text](target "title"); <...> may hold spaces.
        let target = match inside.trim_start().strip_prefix('<') {
            Some(rest) => rest.split('>').next().unwrap_or(""),
            None => inside.split_whitespace().next().unwrap_or(""),
        };
        out.push((text, target.to_string()));
        i = after_target;
    }
    out
}

/// GitHub's anchor for a heading: lowercase, only letters, digits, spaces, hyphens and
/// underscores kept, spaces turned into hyphens.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A heading's text as GitHub renders it for its anchor: no code-span backticks, links reduced
/// to their text, no closing `#`s.
fn heading_text(raw: &str) -> String {
    let raw = raw.trim().trim_end_matches('#').trim_end();
    let mut text = raw.to_string();
    for (label, target) in links(raw) {
        text = text.replace(&format!("[{label}]({target})"), &label);
    }
    text.replace('`', "")
}

/// Every anchor a Markdown document offers, duplicates numbered as GitHub does (`-1`, `-2`).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let level = line.chars().take_while(|&c| c == '#').count();
        if level == 0 || level > 6 || !line[level..].starts_with(' ') {
            continue;
        }
        let base = slug(&heading_text(&line[level..]));
        let count = seen.entry(base.clone()).or_insert(0);
        out.push(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    out
}

/// What is wrong with one link from `from`, if anything.
fn check_link(from: &Path, target: &str) -> Option<String> {
    let (file_part, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor)),
        None => (target, None),
    };
    let file = if file_part.is_empty() {
        from.to_path_buf()
    } else {
        let decoded = file_part.replace("%20", " ");
        from.parent()
            .expect("a document has a directory")
            .join(decoded)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    let anchor = anchor?;
    if anchor.is_empty() {
        return Some("empty anchor".to_string());
    }
    if file.is_dir() || file.extension().is_none_or(|ext| ext != "md") {
        return Some(format!(
            "anchor #{anchor} into {}, which is not Markdown",
            file.display()
        ));
    }
    let offered = anchors(&read(&file));
    if offered.iter().any(|a| a == anchor) {
        None
    } else {
        Some(format!(
            "{} has no heading with anchor #{anchor}",
            shown(&file)
        ))
    }
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        for (number, line) in prose_lines(&text) {
            for (label, target) in links(&without_code_spans(line)) {
                if ["http://", "https://", "mailto:"]
                    .iter()
                    .any(|p| target.starts_with(p))
                {
                    continue;
                }
                checked += 1;
                if let Some(problem) = check_link(&doc, &target) {
                    broken.push(format!(
                        "{}:{number}: [{label}]({target}): {problem}",
                        shown(&doc)
                    ));
                }
            }
        }
    }
    assert!(
        checked > 0,
        "no relative links found at all: is the link parser broken?"
    );
    assert!(
        broken.is_empty(),
        "{} broken link(s) in README.md and docs/*.md:\n  {}",
        broken.len(),
        broken.join("\n  ")
    );
}

#[test]
fn readme_is_short_and_starts_with_the_two_commands() {
    let readme = read(&repo().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} and move depth into docs/"
    );
    assert!(
        readme.starts_with(README_START),
        "README.md must start with the title, the two-command block (sandbox, .ci/run) and the \
         sandbox paragraph, exactly:\n{README_START}"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("When relaylet ends a session"),
        "when-relaylet-ends-a-session"
    );
    assert_eq!(
        slug("1. Root cluster: the apiserver flag"),
        "1-root-cluster-the-apiserver-flag"
    );
    assert_eq!(
        slug(&heading_text(
            "What was tuned (before -> after; `--quick` runs)"
        )),
        "what-was-tuned-before---after---quick-runs"
    );
    assert_eq!(
        slug("Earlier results (before issue 18)"),
        "earlier-results-before-issue-18"
    );
    assert_eq!(slug("Ünïcode_ok héading"), "ünïcode_ok-héading");
    assert_eq!(
        anchors("# A\n## A\n```\n# A\n```\n### A ##\n#nope\n"),
        ["a", "a-1", "a-2"]
    );
}

#[test]
fn links_in_code_are_not_links() {
    let line = "see [a](x.md#b), `[c](y.md)`, ``[d](z.md) ` `` then [e](https://e) [f](<g h.md>)";
    let found: Vec<String> = links(&without_code_spans(line))
        .into_iter()
        .map(|l| l.1)
        .collect();
    assert_eq!(found, ["x.md#b", "https://e", "g h.md"]);
    assert_eq!(
        links("[a [nested] b](t.md (title))"),
        [("a [nested] b".into(), "t.md".into())]
    );
    let fenced = prose_lines("x\n  ```sh\n[a](b)\n  ```\ny");
    assert_eq!(fenced, [(1, "x"), (5, "y")]);
}
