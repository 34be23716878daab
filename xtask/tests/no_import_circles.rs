//! No import circles between the modules of a crate.
//!
//! Every crate under `crates/` is read from its `src/lib.rs` down its `mod` declarations (a
//! module's own file, `#[path]` files and inline `mod` blocks) as the library is built: items
//! under `#[cfg(test)]` (test modules and their helpers) and `#[cfg(doc)]` (imports for doc
//! links) are left out, as a module graph of the library leaves them out. A module imports
//! another when its code names an item of it: a `use` of a `crate::`, `super::`, `self::` or
//! child-module path, or such a path in a type, an expression, a pattern or the arguments of an
//! expression-like macro (`format!`, `assert_eq!`, `vec!`). A name reached through a re-export
//! (`crate::Error` where the root has `pub use error::Error`) counts as an import of the module
//! that defines it; a name another crate defines counts as nothing.
//!
//! A module with its submodules is one module to its siblings: an import of `a::x` by `b::y`
//! is an arrow from `b` to `a` among the root's modules, and a module and its own submodules
//! (a parent declaring and using its children, a child naming `super::Parent`) draw no arrow
//! between each other. The test fails when the arrows among the children of some module make a
//! circle, naming its modules, one loop through them and a path that makes each arrow of it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::visit::Visit;

/// Circles known and not yet broken: a crate and the modules of one circle, as the failure
/// message names them. They are reported and do not fail the test; a listed circle that no
/// longer exists fails it, so that the list only shrinks.
const ALLOWED: &[(&str, &[&str])] = &[];

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let crates_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut report = String::new();
    let mut failures = String::new();
    let mut seen_allowed = BTreeSet::new();
    let mut checked = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", crates_dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("src/lib.rs").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let graph = ModuleGraph::read(&dir.join("src/lib.rs"));
        checked.push(format!("{name} ({} modules)", graph.modules.len()));
        for circle in graph.circles() {
            let text = graph.describe(&circle);
            let members: BTreeSet<String> = circle.iter().map(|&m| graph.name(m)).collect();
            let allowed = ALLOWED.iter().find(|(krate, modules)| {
                *krate == name
                    && modules
                        .iter()
                        .map(|m| m.to_string())
                        .collect::<BTreeSet<_>>()
                        == members
            });
            match allowed {
                Some(&(krate, modules)) => {
                    seen_allowed.insert((krate, modules));
                    writeln!(report, "{name} (allowed): {text}").unwrap();
                }
                None => writeln!(failures, "{name}: {text}").unwrap(),
            }
        }
    }
    for &(krate, modules) in ALLOWED {
        if !seen_allowed.contains(&(krate, modules)) {
            writeln!(
                failures,
                "{krate}: the allowed circle {modules:?} is gone: remove it from ALLOWED"
            )
            .unwrap();
        }
    }
    println!("checked: {}", checked.join(", "));
    print!("{report}");
    for expected in ["parsley-dsl", "parsley-stage", "parsley-runtime"] {
        assert!(
            checked
                .iter()
                .any(|c| c.starts_with(&format!("{expected} "))),
            "{expected} was not read: {checked:?}"
        );
    }
    assert!(
        failures.is_empty(),
        "import circles between modules:\n{failures}"
    );
}

/// The scanner on a small crate written for it: a circle between siblings through a
/// submodule and a re-export is found; an import of another crate's re-exported name, a parent
/// and child importing each other, test modules and imports for doc links make none.
#[test]
fn the_scanner_finds_a_circle_through_a_re_export_and_nothing_else() {
    let dir = std::env::temp_dir().join(format!("no-import-circles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("low")).unwrap();
    let files = [
        (
            "lib.rs",
            "mod low; mod high; mod other;\n\
             pub use high::High;\npub use low::Low;\npub use external::Thing;\n\
             fn ok() -> bool { true }",
        ),
        (
            "low/mod.rs",
            "mod part;\npub use part::Low;\nfn helper() {}",
        ),
        // `low` names `High` through the root's re-export: a circle with `high`.
        (
            "low/part.rs",
            "pub struct Low;\n\
             fn f() -> Option<crate::High> { super::helper(); assert!(super::super::ok()); None }",
        ),
        (
            "high.rs",
            "use crate::low::Low;\npub struct High(Low);\n\
             #[cfg(test)] mod tests { use crate::other::*; }\n\
             #[cfg(test)] mod helpers;\n\
             #[cfg(doc)] use crate::other::h;",
        ),
        // Another crate's name through a re-export, and the root's own function.
        (
            "other.rs",
            "use crate::{Low, Thing};\nfn h() { let _ = format!(\"{}\", crate::ok()); }",
        ),
    ];
    for (path, text) in files {
        std::fs::write(src.join(path), text).unwrap();
    }

    let graph = ModuleGraph::read(&src.join("lib.rs"));
    let edges: BTreeSet<(String, String)> = graph
        .edges
        .keys()
        .map(|&(a, b)| (graph.name(a), graph.name(b)))
        .collect();
    let edge = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        edges,
        BTreeSet::from([
            edge("high", "low"),
            edge("low", "high"),
            edge("other", "low")
        ])
    );
    let circles: Vec<Vec<String>> = graph
        .circles()
        .iter()
        .map(|c| c.iter().map(|&m| graph.name(m)).collect())
        .collect();
    assert_eq!(circles, [["high", "low"]]);
    let text = graph.describe(&graph.circles()[0]);
    assert!(
        text.contains("high -> low: crate::low::Low (src/high.rs)"),
        "{text}"
    );
    assert!(
        text.contains("low -> high: crate::High (src/low/part.rs)"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One module: a file, or an inline `mod` block in one.
struct Module {
    /// Path from the crate root; empty for the root.
    path: Vec<String>,
    file: PathBuf,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Names of the items defined here (not imported).
    items: BTreeSet<String>,
    /// `use` names: the name in scope and the path it stands for.
    imports: BTreeMap<String, Vec<String>>,
    /// `use path::*` prefixes.
    globs: Vec<Vec<String>>,
    /// Every path this module's code names, as written.
    refs: Vec<Vec<String>>,
}

struct ModuleGraph {
    modules: Vec<Module>,
    /// Importer and imported module, with the first path (and its file) that makes the arrow.
    edges: BTreeMap<(usize, usize), String>,
    root_dir: PathBuf,
}

impl ModuleGraph {
    fn read(lib: &Path) -> ModuleGraph {
        let mut graph = ModuleGraph {
            modules: Vec::new(),
            edges: BTreeMap::new(),
            root_dir: lib.parent().unwrap().parent().unwrap().to_path_buf(),
        };
        let dir = lib.parent().unwrap().to_path_buf();
        graph.read_file(None, Vec::new(), lib, dir);
        for from in 0..graph.modules.len() {
            for path in graph.modules[from].refs.clone() {
                let Some(to) = graph.resolve(from, &path, 0) else {
                    continue;
                };
                let Some(arrow) = graph.lift(from, to) else {
                    continue;
                };
                let file = graph.relative(&graph.modules[from].file);
                graph
                    .edges
                    .entry(arrow)
                    .or_insert_with(|| format!("{} ({file})", path.join("::")));
            }
        }
        graph
    }

    fn relative(&self, file: &Path) -> String {
        let file = file.strip_prefix(&self.root_dir).unwrap_or(file);
        file.to_string_lossy().replace('\\', "/")
    }

    /// Reads the module at `file` (`children_dir`: where its `mod x;` files are).
    fn read_file(
        &mut self,
        parent: Option<usize>,
        path: Vec<String>,
        file: &Path,
        children_dir: PathBuf,
    ) {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let id = self.add(parent, path, file);
        self.read_items(id, &parsed.items, file, &children_dir);
    }

    fn add(&mut self, parent: Option<usize>, path: Vec<String>, file: &Path) -> usize {
        let id = self.modules.len();
        if let (Some(parent), Some(name)) = (parent, path.last()) {
            self.modules[parent].children.insert(name.clone(), id);
        }
        self.modules.push(Module {
            path,
            file: file.to_path_buf(),
            parent,
            children: BTreeMap::new(),
            items: BTreeSet::new(),
            imports: BTreeMap::new(),
            globs: Vec::new(),
            refs: Vec::new(),
        });
        id
    }

    fn read_items(&mut self, id: usize, items: &[syn::Item], file: &Path, children_dir: &Path) {
        let file_dir = file.parent().unwrap();
        for item in items {
            if left_out(item_attrs(item)) {
                continue;
            }
            if let Some(name) = item_name(item) {
                self.modules[id].items.insert(name);
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut path = self.modules[id].path.clone();
                    path.push(name.clone());
                    match &m.content {
                        Some((_, inner)) => {
                            let child = self.add(Some(id), path, file);
                            self.read_items(child, inner, file, &children_dir.join(&name));
                        }
                        None => {
                            let (child_file, child_dir) = match path_attribute(&m.attrs) {
                                Some(p) => {
                                    let f = file_dir.join(p);
                                    let d = f.with_extension("");
                                    (f, d)
                                }
                                None if children_dir.join(format!("{name}.rs")).is_file() => (
                                    children_dir.join(format!("{name}.rs")),
                                    children_dir.join(&name),
                                ),
                                None => (
                                    children_dir.join(&name).join("mod.rs"),
                                    children_dir.join(&name),
                                ),
                            };
                            self.read_file(Some(id), path, &child_file, child_dir);
                        }
                    }
                }
                syn::Item::Use(u) => {
                    let module = &mut self.modules[id];
                    use_tree(&u.tree, &mut Vec::new(), &mut |leaf| match leaf {
                        UseLeaf::Name(alias, path) => {
                            module.refs.push(path.clone());
                            if let Some(alias) = alias {
                                module.imports.insert(alias, path);
                            }
                        }
                        UseLeaf::Glob(path) => {
                            module.refs.push(path.clone());
                            module.globs.push(path);
                        }
                    });
                }
                other => {
                    let mut refs = Refs(Vec::new());
                    refs.visit_item(other);
                    self.modules[id].refs.extend(refs.0);
                }
            }
        }
    }

    fn parent(&self, m: usize) -> Option<usize> {
        self.modules[m].parent
    }

    /// `from`'s import of `to` as an arrow between the two children of their closest common
    /// ancestor that hold them (a module with its submodules is one, seen from its siblings);
    /// `None` where one holds the other (a module and its own submodules are one).
    fn lift(&self, from: usize, to: usize) -> Option<(usize, usize)> {
        let chain = |mut m: usize| {
            let mut chain = vec![m];
            while let Some(p) = self.parent(m) {
                chain.push(p);
                m = p;
            }
            chain.reverse();
            chain
        };
        let (a, b) = (chain(from), chain(to));
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        Some((*a.get(common)?, *b.get(common)?))
    }

    /// The module whose item `path` (named in module `from`) is; `None` for another crate's.
    fn resolve(&self, from: usize, path: &[String], depth: u32) -> Option<usize> {
        if depth > 32 {
            return None;
        }
        let first = path.first()?;
        let (start, rest) = match first.as_str() {
            "crate" => (0, &path[1..]),
            "self" => (from, &path[1..]),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let mut m = from;
                for _ in 0..supers {
                    m = self.parent(m)?;
                }
                (m, &path[supers..])
            }
            name => {
                if let Some(&child) = self.modules[from].children.get(name) {
                    (child, &path[1..])
                } else if let Some(target) = self.modules[from].imports.get(name) {
                    if target[0] == *name {
                        return None; // `use name;` or `use name::{self}` of another crate
                    }
                    let full: Vec<String> = target.iter().chain(&path[1..]).cloned().collect();
                    return self.resolve(from, &full, depth + 1);
                } else {
                    return None; // another crate, a type, a variable or a generic
                }
            }
        };
        match self.walk(start, rest, depth) {
            Found::In(m) => Some(m),
            Found::Elsewhere => None,
            Found::NotSeen(m) => Some(m),
        }
    }

    /// Follows `rest` down from module `m`.
    fn walk(&self, m: usize, rest: &[String], depth: u32) -> Found {
        let Some(first) = rest.first() else {
            return Found::In(m);
        };
        let module = &self.modules[m];
        if let Some(&child) = module.children.get(first) {
            return self.walk(child, &rest[1..], depth);
        }
        if module.items.contains(first) {
            return Found::In(m);
        }
        if let Some(target) = module.imports.get(first) {
            let full: Vec<String> = target.iter().chain(&rest[1..]).cloned().collect();
            return match self.resolve(m, &full, depth + 1) {
                Some(to) => Found::In(to),
                None => Found::Elsewhere,
            };
        }
        for glob in &module.globs {
            if depth > 32 {
                break;
            }
            let full: Vec<String> = glob.iter().chain(rest).cloned().collect();
            let (start, tail) = match self.start_of(m, &full) {
                Some(s) => s,
                None => continue,
            };
            if let Found::In(to) = self.walk(start, tail, depth + 1) {
                return Found::In(to);
            }
        }
        Found::NotSeen(m)
    }

    /// The module a glob's path starts from, for `walk`: `None` for another crate's.
    fn start_of<'p>(&self, m: usize, path: &'p [String]) -> Option<(usize, &'p [String])> {
        match path.first()?.as_str() {
            "crate" => Some((0, &path[1..])),
            "self" => Some((m, &path[1..])),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let mut to = m;
                for _ in 0..supers {
                    to = self.parent(to)?;
                }
                Some((to, &path[supers..]))
            }
            name => self.modules[m].children.get(name).map(|&c| (c, &path[1..])),
        }
    }

    fn name(&self, m: usize) -> String {
        if self.modules[m].path.is_empty() {
            "crate".to_string()
        } else {
            self.modules[m].path.join("::")
        }
    }

    /// The circles: strongly connected components of more than one module, each sorted by
    /// name, in name order.
    fn circles(&self) -> Vec<Vec<usize>> {
        let n = self.modules.len();
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in self.edges.keys() {
            next[a].push(b);
        }
        // Tarjan's algorithm.
        struct State {
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            on_stack: Vec<bool>,
            stack: Vec<usize>,
            counter: usize,
            components: Vec<Vec<usize>>,
        }
        fn connect(v: usize, next: &[Vec<usize>], s: &mut State) {
            s.index[v] = Some(s.counter);
            s.low[v] = s.counter;
            s.counter += 1;
            s.stack.push(v);
            s.on_stack[v] = true;
            for &w in &next[v] {
                match s.index[w] {
                    None => {
                        connect(w, next, s);
                        s.low[v] = s.low[v].min(s.low[w]);
                    }
                    Some(i) if s.on_stack[w] => s.low[v] = s.low[v].min(i),
                    Some(_) => {}
                }
            }
            if Some(s.low[v]) == s.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = s.stack.pop().unwrap();
                    s.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                s.components.push(component);
            }
        }
        let mut state = State {
            index: vec![None; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            stack: Vec::new(),
            counter: 0,
            components: Vec::new(),
        };
        for v in 0..n {
            if state.index[v].is_none() {
                connect(v, &next, &mut state);
            }
        }
        let mut circles: Vec<Vec<usize>> = state
            .components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|mut c| {
                c.sort_by_key(|&m| self.name(m));
                c
            })
            .collect();
        circles.sort_by_key(|c| self.name(c[0]));
        circles
    }

    /// A circle's modules, its shortest loop through its first module and every arrow inside it.
    fn describe(&self, circle: &[usize]) -> String {
        let inside: BTreeSet<usize> = circle.iter().copied().collect();
        let start = circle[0];
        // Breadth-first from `start` back to `start`, inside the circle.
        let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut back = None;
        'search: while let Some(v) = queue.pop_front() {
            for &(a, b) in self.edges.keys() {
                if a != v || !inside.contains(&b) {
                    continue;
                }
                if b == start {
                    back = Some(v);
                    break 'search;
                }
                if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(b) {
                    e.insert(v);
                    queue.push_back(b);
                }
            }
        }
        let mut cycle = vec![start];
        let mut v = back.expect("a strongly connected component has a loop");
        while v != start {
            cycle.push(v);
            v = came_from[&v];
        }
        cycle[1..].reverse();
        cycle.push(start);
        let names: Vec<String> = circle.iter().map(|&m| self.name(m)).collect();
        let path: Vec<String> = cycle.iter().map(|&m| self.name(m)).collect();
        let mut text = format!("[{}], as in {}\n", names.join(", "), path.join(" -> "));
        for (&(a, b), example) in &self.edges {
            if inside.contains(&a) && inside.contains(&b) {
                writeln!(text, "    {} -> {}: {example}", self.name(a), self.name(b)).unwrap();
            }
        }
        text
    }
}

enum Found {
    /// In this module (an item of it, or the module itself).
    In(usize),
    /// Another crate's item, re-exported.
    Elsewhere,
    /// A name the scanner did not see defined (made by a macro, say) in this module.
    NotSeen(usize),
}

enum UseLeaf {
    /// The name a `use` brings into scope (`None` for `as _`) and its path.
    Name(Option<String>, Vec<String>),
    Glob(Vec<String>),
}

fn use_tree(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut dyn FnMut(UseLeaf)) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_tree(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                out(UseLeaf::Name(prefix.last().cloned(), prefix.clone()));
            } else {
                let mut path = prefix.clone();
                path.push(name.clone());
                out(UseLeaf::Name(Some(name), path));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            let name = r.ident.to_string();
            if name != "self" {
                path.push(name);
            }
            let alias = r.rename.to_string();
            out(UseLeaf::Name((alias != "_").then_some(alias), path));
        }
        syn::UseTree::Glob(_) => out(UseLeaf::Glob(prefix.clone())),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_tree(tree, prefix, out);
            }
        }
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::ExternCrate(i) => i.rename.as_ref().map(|(_, r)| r).unwrap_or(&i.ident),
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Mod(i) => &i.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Whether `#[cfg(test)]` or `#[cfg(doc)]` leaves these attributes' item out of the library.
fn left_out(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        syn::Meta::List(list) if list.path.is_ident("cfg") => {
            let condition = list.tokens.to_string();
            condition == "test" || condition == "doc"
        }
        _ => false,
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The paths of more than one segment that some code names (`use` items in function bodies
/// included; `mod` blocks are modules of their own and are read as such).
struct Refs(Vec<Vec<String>>);

impl<'ast> Visit<'ast> for Refs {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            self.0
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        use_tree(&item.tree, &mut Vec::new(), &mut |leaf| match leaf {
            UseLeaf::Name(_, path) | UseLeaf::Glob(path) => self.0.push(path),
        });
    }

    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !left_out(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !left_out(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let parser = Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(args) = mac.parse_body_with(parser) {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
        syn::visit::visit_macro(self, mac);
    }
}
