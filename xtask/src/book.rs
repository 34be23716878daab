//! `cargo xtask book`: builds the book with mdBook, warnings denied, and checks every relative
//! link and anchor in the built HTML, and every relative link of the README.
//!
//! mdBook is installed from crates.io at [`MDBOOK_VERSION`] when the `mdbook` found is missing
//! or another version. The book is built into `target/book`. Then:
//!
//! - every `href` and `src` of every built page that is not an absolute URL must name a file of
//!   the build (a directory stands for its `index.html`), and its `#fragment`, if any, must be
//!   the `id` of an element of that page (of the same page for a bare `#fragment`); a link
//!   starting with `/` is taken from the book's root;
//! - every relative Markdown link of `README.md` must name a file or directory of the
//!   repository (its anchors are not checked: GitHub makes them, not mdBook).
//!
//! A broken link fails the step with the page and the link.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The mdBook release the book is built with (and installed, when missing).
pub const MDBOOK_VERSION: &str = "0.5.4";

/// The repository's root (the parent of `xtask/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the repository")
        .to_path_buf()
}

/// Installs mdBook if needed, builds the book and checks its links and the README's.
pub fn check() -> Result<()> {
    let mdbook = ensure_mdbook()?;
    let root = root();
    let dest = root.join("target/book");
    if dest.exists() {
        std::fs::remove_dir_all(&dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    let out = Command::new(&mdbook)
        .arg("build")
        .arg(root.join("book"))
        .arg("--dest-dir")
        .arg(&dest)
        .output()
        .with_context(|| format!("running {}", mdbook.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{log}");
    if !out.status.success() {
        bail!("mdbook build failed ({})", out.status);
    }
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    if !warnings.is_empty() {
        bail!(
            "mdbook build warned (warnings are denied):\n{}",
            warnings.join("\n")
        );
    }
    let mut problems = check_html(&dest)?;
    problems.extend(check_markdown_links(&root.join("README.md"), &root)?);
    if !problems.is_empty() {
        bail!(
            "{} broken link(s):\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
    println!(
        "xtask: the book built with mdbook {MDBOOK_VERSION} at {}; every relative link and anchor resolves",
        dest.display()
    );
    Ok(())
}

/// The `mdbook` to run: the one on `PATH` or in Cargo's `bin` directory if it is
/// [`MDBOOK_VERSION`], else the one `cargo install` puts there.
fn ensure_mdbook() -> Result<PathBuf> {
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|home| home.join("bin").join("mdbook"));
    let candidates = [Some(PathBuf::from("mdbook")), cargo_bin.clone()];
    for candidate in candidates.iter().flatten() {
        if version_of(candidate).as_deref() == Some(MDBOOK_VERSION) {
            return Ok(candidate.clone());
        }
    }
    println!("xtask: installing mdbook {MDBOOK_VERSION} (cargo install mdbook --locked)");
    let status = super::cargo()
        .args([
            "install",
            "mdbook",
            "--locked",
            "--version",
            MDBOOK_VERSION,
            "-j2",
        ])
        .status()
        .context("running cargo install mdbook")?;
    if !status.success() {
        bail!("cargo install mdbook --version {MDBOOK_VERSION} failed ({status})");
    }
    let installed = cargo_bin.context("no CARGO_HOME or HOME: where did cargo install put it?")?;
    match version_of(&installed) {
        Some(v) if v == MDBOOK_VERSION => Ok(installed),
        other => bail!(
            "{} reports version {other:?} after installing {MDBOOK_VERSION}",
            installed.display()
        ),
    }
}

/// The version `mdbook --version` reports (`mdbook v0.5.4` → `0.5.4`), if it runs.
fn version_of(mdbook: &Path) -> Option<String> {
    let out = Command::new(mdbook).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let word = text.split_whitespace().nth(1)?;
    Some(word.trim_start_matches('v').to_string())
}

/// Checks the relative links and anchors of every `.html` page under `dir`; returns one line
/// per broken link (empty: all resolve).
pub fn check_html(dir: &Path) -> Result<Vec<String>> {
    let mut pages = Vec::new();
    collect_html(dir, &mut pages)?;
    pages.sort();
    let mut ids: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for page in &pages {
        let html =
            std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
        let shown = page.strip_prefix(dir).unwrap_or(page).display().to_string();
        let links = attribute_values(&html, "href")
            .into_iter()
            .chain(attribute_values(&html, "src"));
        for link in links {
            if is_external(&link) {
                continue;
            }
            let (path, fragment) = match link.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.as_str(), None),
            };
            let path = path.split('?').next().unwrap_or_default();
            let target = if path.is_empty() {
                page.clone()
            } else {
                // A link from the site's root (`404.html` has them: it is served at any depth)
                // resolves against the book's root.
                let (base, path) = match path.strip_prefix('/') {
                    Some(rooted) => (dir, rooted),
                    None => (page.parent().unwrap_or(dir), path),
                };
                match normalize(&base.join(percent_decode(path))) {
                    Some(t) if t.starts_with(dir) => t,
                    _ => {
                        problems.push(format!("{shown}: `{link}` leaves the book"));
                        continue;
                    }
                }
            };
            let target = if target.is_dir() {
                target.join("index.html")
            } else {
                target
            };
            if !target.is_file() {
                problems.push(format!("{shown}: `{link}`: no such file"));
                continue;
            }
            let Some(fragment) = fragment.filter(|f| !f.is_empty()) else {
                continue;
            };
            if target.extension().is_none_or(|e| e != "html") {
                continue;
            }
            if !ids.contains_key(&target) {
                let text = std::fs::read_to_string(&target)
                    .with_context(|| format!("reading {}", target.display()))?;
                ids.insert(
                    target.clone(),
                    attribute_values(&text, "id").into_iter().collect(),
                );
            }
            if !ids[&target].contains(&percent_decode(fragment)) {
                problems.push(format!("{shown}: `{link}`: no anchor `#{fragment}`"));
            }
        }
    }
    Ok(problems)
}

/// Checks that every relative Markdown link (`[text](target)`) of `file` names a file or
/// directory (relative to `file`'s directory, or to `root` for a target starting with `/`).
pub fn check_markdown_links(file: &Path, root: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let shown = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let mut problems = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            rest = &rest[end..];
            if target.is_empty() || is_external(target) || target.starts_with('#') {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            let resolved = match path.strip_prefix('/') {
                Some(p) => root.join(p),
                None => file.parent().unwrap_or(root).join(path),
            };
            if !resolved.exists() {
                problems.push(format!("{shown}: `{target}`: no such file"));
            }
        }
    }
    Ok(problems)
}

fn collect_html(dir: &Path, pages: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_html(&path, pages)?;
        } else if path.extension().is_some_and(|e| e == "html") {
            pages.push(path);
        }
    }
    Ok(())
}

/// The values of every `name="…"` attribute in `html` (entities `&amp;` and `&quot;`
/// decoded). Text inside code blocks has its quotes escaped, so it is not matched.
fn attribute_values(html: &str, name: &str) -> Vec<String> {
    let needle = format!("{name}=\"");
    let mut values = Vec::new();
    let mut from = 0;
    while let Some(at) = html[from..].find(&needle) {
        let start = from + at;
        let value_start = start + needle.len();
        from = value_start;
        let preceded_by_space = html[..start]
            .chars()
            .next_back()
            .is_some_and(char::is_whitespace);
        let Some(len) = html[value_start..].find('"') else {
            break;
        };
        if preceded_by_space {
            values.push(
                html[value_start..value_start + len]
                    .replace("&quot;", "\"")
                    .replace("&amp;", "&"),
            );
        }
    }
    values
}

/// A link with a scheme (`https:`, `mailto:`, `data:`, …) or a protocol-relative one.
fn is_external(link: &str) -> bool {
    link.starts_with("//")
        || link
            .split_once(':')
            .is_some_and(|(scheme, _)| !scheme.is_empty() && !scheme.contains(['/', '#', '.']))
}

/// `%XX` escapes decoded (UTF-8, lossy).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(hex) = std::str::from_utf8(&bytes[i + 1..i + 3])
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` resolved lexically; `None` when `..` climbs above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-book-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("images")).unwrap();
        dir
    }

    #[test]
    fn links_that_resolve_pass() {
        let dir = scratch("ok");
        std::fs::write(
            dir.join("index.html"),
            r##"<a href="gate.html#the-rule">rule</a> <a href="#top">top</a>
               <h1 id="top">x</h1> <img src="images/path.svg"> <base href="/">
               <a href="/gate.html#the-rule">from the root</a>
               <a href="https://example.org/x.html#nowhere">out</a>
               <code>&lt;a href=&quot;missing.html&quot;&gt;</code>"##,
        )
        .unwrap();
        std::fs::write(dir.join("gate.html"), r#"<h2 id="the-rule">The rule</h2>"#).unwrap();
        std::fs::write(dir.join("images/path.svg"), "<svg/>").unwrap();
        assert_eq!(check_html(&dir).unwrap(), Vec::<String>::new());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_planted_broken_link_and_anchor_are_caught() {
        let dir = scratch("broken");
        std::fs::write(
            dir.join("index.html"),
            r##"<a href="gate.html#the-rule">ok</a>
               <a href="gaet.html">a typo in a file name</a>
               <a href="gate.html#the-rules">a typo in an anchor</a>
               <a href="#nowhere">a missing anchor on this page</a>
               <img src="images/missing.svg">
               <a href="../outside.html">outside</a>"##,
        )
        .unwrap();
        std::fs::write(dir.join("gate.html"), r#"<h2 id="the-rule">The rule</h2>"#).unwrap();
        let problems = check_html(&dir).unwrap();
        assert_eq!(
            problems,
            [
                "index.html: `gaet.html`: no such file",
                "index.html: `gate.html#the-rules`: no anchor `#the-rules`",
                "index.html: `#nowhere`: no anchor `#nowhere`",
                "index.html: `../outside.html` leaves the book",
                "index.html: `images/missing.svg`: no such file",
            ]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_planted_broken_readme_link_is_caught() {
        let dir = scratch("readme");
        std::fs::create_dir_all(dir.join("book/src")).unwrap();
        std::fs::write(dir.join("book/src/tutorial.md"), "# Tutorial").unwrap();
        std::fs::write(
            dir.join("README.md"),
            "See [the tutorial](book/src/tutorial.md#step-1), [the site](https://example.org),\n\
             [a section](#quick-start) and [a typo](book/src/tutorail.md).\n\
             ```text\n[not a link](nowhere.md)\n```\n",
        )
        .unwrap();
        let problems = check_markdown_links(&dir.join("README.md"), &dir).unwrap();
        assert_eq!(
            problems,
            ["README.md: `book/src/tutorail.md`: no such file"]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn external_links_and_escapes() {
        assert!(is_external("https://docs.rs/parsley"));
        assert!(is_external("mailto:a@b"));
        assert!(is_external("//cdn.example/x.js"));
        assert!(!is_external("gate.html#a:b"));
        assert!(!is_external("images/a.svg"));
        assert_eq!(percent_decode("a%20b%2"), "a b%2");
    }
}
