//! Spec citations, checked (in the spirit of s2n-quic's duvet).
//!
//! Code cites spec.md with a line `//= spec.md#<ID>`, optionally followed by
//! `//#` lines that quote the item. [`check`] reads spec.md, every source file
//! of the repository and the exception list (`spec-citations.txt`), and
//! reports, as [`Problem`]s:
//!
//! - a cited ID that is not an item of spec.md;
//! - a quote that is not verbatim text of the item it cites (line breaks,
//!   runs of spaces and markdown emphasis aside);
//! - a numbered item (S, P, L, C, E, A, LN, H, M, R, F, T) cited by no code
//!   that implements it or by no test that checks it, unless the exception
//!   list names it, with a reason of its own;
//! - an exception that is stale (the item is cited after all), unknown or
//!   without its own reason.
//!
//! A citation counts for a test if it is in a test file (a `tests` directory
//! or `tests.rs`), after the file's `#[cfg(test)]`, or marked `type=test`
//! after its ID (`//= spec.md#<ID> type=test`, as duvet's `//= type=test`:
//! a check outside a test file, such as a property of the model checker
//! that its tests evaluate); for code otherwise.
//! Every step of the §A table is also cited by both encodings of §A
//! ([`missing_step_ids`], in [`STEP_DIRS`]).
//!
//! spec.md's coverage table ("Coverage of the mechanisms", [`check_coverage`])
//! names, per mechanism of the concurrent code, its source files, the §A
//! steps of the checker that encode it, the loom models that explore it and
//! the mutants that break it: each name must exist (a step tagged in
//! [`MODEL_STEP_DIR`], a `fn` in [`LOOM_SOURCES`], a quoted name in
//! [`MUTANTS_FILE`], a file), a row with neither a step nor a loom model
//! must say "tests only", and every source file with an atomic under
//! [`ATOMIC_DIRS`] must be named by a row. A cell without names says `none`,
//! or `none (why)`.
//!
//! The binary, `cargo run -q -p mrcache-citations [-- ROOT]`, runs both on
//! the repository (ROOT: the workspace this crate is in), prints the counts
//! of citations and exceptions, and exits non-zero on any problem.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// A numbered item of spec.md and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub id: String,
    /// The item's text as spec.md writes it (a bullet with its continuation
    /// lines, a table row, a C-rule, or a section title).
    pub text: String,
    /// Whether code and a test must cite it: every numbered item, and the
    /// sections that have none (S8, S9). Sections with numbered items are
    /// valid targets but need no citation of their own.
    pub required: bool,
}

/// One `//= spec.md#<ID>` citation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Citation {
    pub file: String,
    pub line: usize,
    pub id: String,
    /// The `//#` lines that follow, joined by spaces.
    pub quote: Option<String>,
    pub test: bool,
}

/// What is missing for an item (an exception's kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Missing {
    Code,
    Test,
    Both,
}

/// One entry of the exception list: an item that is not cited by code, by a
/// test or by either, and why; or a quote that is knowingly not verbatim yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exception {
    Uncited { id: String, missing: Missing, reason: String },
    Quote { file: String, id: String, reason: String },
}

/// What the check found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    UnknownId { file: String, line: usize, id: String },
    NotVerbatim { file: String, line: usize, id: String, quote: String },
    Uncited { id: String, missing: Missing },
    BadException { entry: String, why: String },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::UnknownId { file, line, id } => write!(f, "{file}:{line}: spec.md has no item {id}"),
            Problem::NotVerbatim { file, line, id, quote } => {
                write!(f, "{file}:{line}: the quote is not spec.md's text of {id}: \"{quote}\"")
            }
            Problem::Uncited { id, missing } => {
                let what = match missing {
                    Missing::Code => "no code",
                    Missing::Test => "no test",
                    Missing::Both => "no code and no test",
                };
                write!(f, "{id}: cited by {what}, and not listed as an exception")
            }
            Problem::BadException { entry, why } => write!(f, "exception `{entry}`: {why}"),
        }
    }
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    pub citations: usize,
    pub quotes: usize,
    pub items: usize,
    pub exceptions: usize,
    pub problems: Vec<Problem>,
}

fn is_id(s: &str) -> bool {
    let mut parts = s.splitn(2, '.');
    let head = parts.next().unwrap_or("");
    let letters: String = head.chars().take_while(|c| c.is_ascii_uppercase()).collect();
    let rest = &head[letters.len()..];
    if letters.is_empty() {
        return false;
    }
    let head_ok = (rest.is_empty() && matches!(letters.as_str(), "A" | "T"))
        || (!rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit()))
        || (letters == "A" && matches!(rest, "-D" | "-H"))
        || (letters == "S" && rest.len() > 1 && rest.ends_with('a') && rest[..rest.len() - 1].chars().all(|c| c.is_ascii_digit()));
    head_ok && parts.next().is_none_or(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// The items of spec.md, in order.
pub fn spec_items(spec: &str) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    // (index in items, whether the section has numbered items)
    let mut section: Option<usize> = None;
    let mut bullet: Option<usize> = None;
    let mut numbered_in_section = false;
    let close_section = |items: &mut Vec<Item>, section: Option<usize>, numbered: bool| {
        if let Some(i) = section {
            items[i].required = !numbered && items[i].id.starts_with('S');
        }
    };
    for line in spec.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            close_section(&mut items, section, numbered_in_section);
            bullet = None;
            numbered_in_section = false;
            let id = h.split_whitespace().next().unwrap_or("");
            section = None;
            if is_id(id) {
                section = Some(items.len());
                items.push(Item { id: id.to_string(), text: h.to_string(), required: false });
            }
            continue;
        }
        if let Some(b) = line.strip_prefix("- **") {
            let id = b.split([' ', '*']).next().unwrap_or("").trim_end_matches('.');
            bullet = None;
            if is_id(id) {
                numbered_in_section = true;
                bullet = Some(items.len());
                items.push(Item { id: id.to_string(), text: line[2..].to_string(), required: true });
            }
            continue;
        }
        if let Some(i) = bullet {
            if line.starts_with("  ") && !line.trim().is_empty() {
                items[i].text.push(' ');
                items[i].text.push_str(line.trim());
                continue;
            }
            bullet = None;
        }
        if let Some(row) = line.trim().strip_prefix("| ") {
            let cells: Vec<&str> = row.trim_end_matches('|').split(" | ").map(str::trim).collect();
            // A row names an item only where it is defined first (the peers'
            // table of S9a reuses P1..L1 as row titles).
            if cells.len() >= 2 && is_id(cells[0]) && cells[0] != "A" && cells[0] != "T" && !items.iter().any(|i| i.id == cells[0]) {
                numbered_in_section = true;
                items.push(Item { id: cells[0].to_string(), text: cells[1..].join(" | "), required: true });
            }
            continue;
        }
        // C-rules: "**C1** text; **C2** text; ..." in one paragraph.
        let mut rest = line;
        while let Some(start) = rest.find("**C") {
            let after = &rest[start + 2..];
            let Some(end) = after.find("**") else { break };
            let id = &after[..end];
            if !is_id(id) {
                break;
            }
            numbered_in_section = true;
            let body = &after[end + 2..];
            let next = body.find("**C").unwrap_or(body.len());
            items.push(Item { id: id.to_string(), text: body[..next].to_string(), required: true });
            rest = &body[next..];
        }
    }
    // A C-rule's text may continue on the next lines: take the paragraph.
    let flat = flatten(spec);
    for it in items.iter_mut().filter(|i| i.id.starts_with('C') && i.id[1..].chars().all(|c| c.is_ascii_digit())) {
        let tag = format!("**{}** ", it.id);
        if let Some(p) = flat.find(&tag) {
            let body = &flat[p + tag.len()..];
            let end = [body.find("**C"), body.find("\n\n")].into_iter().flatten().min().unwrap_or(body.len());
            it.text = body[..end].replace('\n', " ");
        }
    }
    close_section(&mut items, section, numbered_in_section);
    items
}

/// spec.md with each paragraph's lines kept, but blank lines marking ends.
fn flatten(spec: &str) -> String {
    spec.lines().map(|l| if l.trim().is_empty() { "\n" } else { l }).collect::<Vec<_>>().join("\n")
}

/// Text as compared: markdown emphasis and code marks dropped, every run of
/// white space one space.
pub fn normalize(text: &str) -> String {
    text.replace(['*', '`'], "").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `quote` is verbatim text of `item`.
pub fn quote_matches(item: &Item, quote: &str) -> bool {
    let q = normalize(quote);
    !q.is_empty() && normalize(&item.text).contains(&q)
}

/// The citations in one file.
pub fn citations_in(file: &str, source: &str) -> Vec<Citation> {
    let test_file = Path::new(file).components().any(|c| c.as_os_str() == "tests") || file.ends_with("tests.rs");
    let lines: Vec<&str> = source.lines().collect();
    let mut out = Vec::new();
    let mut in_tests = false;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            in_tests = true;
        }
        let Some(rest) = t.strip_prefix("//= spec.md#") else { continue };
        let mut words = rest.split_whitespace();
        let id = words.next().unwrap_or("").to_string();
        let marked_test = words.any(|w| w == "type=test");
        let quote: Vec<&str> = lines[i + 1..]
            .iter()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("//#"))
            .map(|l| l.trim_start_matches("//#").trim())
            .collect();
        let quote = (!quote.is_empty()).then(|| quote.join(" "));
        out.push(Citation { file: file.to_string(), line: i + 1, id, quote, test: test_file || in_tests || marked_test });
    }
    out
}

/// The source files the check reads: `.rs`, `.c` and `.h` under `dirs` of
/// `root`, recursively, sorted.
pub fn source_files(root: &Path, dirs: &[&str]) -> std::io::Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "target") {
                    walk(&p, out)?;
                }
            } else if p.extension().is_some_and(|x| x == "rs" || x == "c" || x == "h") {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for d in dirs {
        let dir = root.join(d);
        if dir.is_dir() {
            walk(&dir, &mut out)?;
        }
    }
    out.sort();
    Ok(out)
}

/// Parses the exception list: `<ID> <code|test|code+test>: <reason>` or
/// `quote <file> <ID>: <reason>`; `#` starts a comment line.
pub fn parse_exceptions(text: &str) -> Result<Vec<Exception>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, reason) = line.split_once(':').ok_or_else(|| format!("line {}: no `: reason`", n + 1))?;
        let reason = reason.trim().to_string();
        let words: Vec<&str> = head.split_whitespace().collect();
        out.push(match words.as_slice() {
            ["quote", file, id] => Exception::Quote { file: file.to_string(), id: id.to_string(), reason },
            [id, kind] => {
                let missing = match *kind {
                    "code" => Missing::Code,
                    "test" => Missing::Test,
                    "code+test" => Missing::Both,
                    _ => return Err(format!("line {}: `{kind}` is not code, test or code+test", n + 1)),
                };
                Exception::Uncited { id: id.to_string(), missing, reason }
            }
            _ => return Err(format!("line {}: expected `ID code|test|code+test: reason`", n + 1)),
        });
    }
    Ok(out)
}

/// Checks `citations` against `items` and `exceptions`.
pub fn check_citations(items: &[Item], citations: &[Citation], exceptions: &[Exception]) -> Report {
    let by_id: BTreeMap<&str, &Item> = items.iter().map(|i| (i.id.as_str(), i)).collect();
    let mut problems = Vec::new();
    let mut reasons = BTreeSet::new();
    let mut excused_quotes = BTreeSet::new();
    let mut uncited_ok: BTreeMap<&str, Missing> = BTreeMap::new();
    for e in exceptions {
        let (entry, id, reason) = match e {
            Exception::Uncited { id, missing, reason } => {
                uncited_ok.insert(id, *missing);
                (id.clone(), id, reason)
            }
            Exception::Quote { file, id, reason } => {
                excused_quotes.insert((file.as_str(), id.as_str()));
                (format!("quote {file} {id}"), id, reason)
            }
        };
        if !by_id.contains_key(id.as_str()) {
            problems.push(Problem::BadException { entry: entry.clone(), why: "spec.md has no such item".into() });
        }
        if reason.len() < 10 || !reasons.insert(reason.as_str()) {
            problems.push(Problem::BadException { entry, why: "each exception needs a reason of its own".into() });
        }
    }
    let mut code = BTreeSet::new();
    let mut test = BTreeSet::new();
    let mut used_quote_exceptions = BTreeSet::new();
    for c in citations {
        let Some(item) = by_id.get(c.id.as_str()) else {
            problems.push(Problem::UnknownId { file: c.file.clone(), line: c.line, id: c.id.clone() });
            continue;
        };
        if c.test {
            test.insert(c.id.as_str());
        } else {
            code.insert(c.id.as_str());
        }
        if let Some(q) = &c.quote {
            if !quote_matches(item, q) {
                if excused_quotes.contains(&(c.file.as_str(), c.id.as_str())) {
                    used_quote_exceptions.insert((c.file.as_str(), c.id.as_str()));
                } else {
                    problems.push(Problem::NotVerbatim { file: c.file.clone(), line: c.line, id: c.id.clone(), quote: q.clone() });
                }
            }
        }
    }
    for (file, id) in &excused_quotes {
        if !used_quote_exceptions.contains(&(*file, *id)) {
            problems.push(Problem::BadException {
                entry: format!("quote {file} {id}"),
                why: "every such quote is verbatim now: remove the exception".into(),
            });
        }
    }
    for item in items.iter().filter(|i| i.required) {
        let id = item.id.as_str();
        let missing = match (code.contains(id), test.contains(id)) {
            (true, true) => None,
            (false, true) => Some(Missing::Code),
            (true, false) => Some(Missing::Test),
            (false, false) => Some(Missing::Both),
        };
        match (missing, uncited_ok.get(id)) {
            (None, None) => {}
            (Some(m), Some(&ok)) if m == ok => {}
            (Some(m), None) => problems.push(Problem::Uncited { id: id.to_string(), missing: m }),
            (m, Some(_)) => problems.push(Problem::BadException {
                entry: id.to_string(),
                why: match m {
                    None => "cited by code and a test now: remove the exception".into(),
                    Some(m) => format!("what is missing is {m:?}, not what the exception says"),
                },
            }),
        }
    }
    for id in uncited_ok.keys() {
        if by_id.get(id).is_some_and(|i| !i.required) {
            problems.push(Problem::BadException { entry: id.to_string(), why: "a section title needs no citation".into() });
        }
    }
    Report {
        citations: citations.len(),
        quotes: citations.iter().filter(|c| c.quote.is_some()).count(),
        items: items.iter().filter(|i| i.required).count(),
        exceptions: exceptions.len(),
        problems,
    }
}

/// The directories whose sources may cite spec.md.
pub const SOURCE_DIRS: [&str; 9] = ["types", "model", "impl", "capi", "testkit", "checker", "src", "tests", "recorder"];

/// The exception list, next to spec.md.
pub const EXCEPTIONS_FILE: &str = "spec-citations.txt";

/// Runs the whole check on the repository at `root`.
pub fn check(root: &Path) -> Result<Report, String> {
    let spec = std::fs::read_to_string(root.join("spec.md")).map_err(|e| format!("spec.md: {e}"))?;
    let exceptions = std::fs::read_to_string(root.join(EXCEPTIONS_FILE)).map_err(|e| format!("{EXCEPTIONS_FILE}: {e}"))?;
    let exceptions = parse_exceptions(&exceptions).map_err(|e| format!("{EXCEPTIONS_FILE}: {e}"))?;
    let mut citations = Vec::new();
    for p in source_files(root, &SOURCE_DIRS).map_err(|e| e.to_string())? {
        let source = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().into_owned();
        citations.extend(citations_in(&rel, &source));
    }
    Ok(check_citations(&spec_items(&spec), &citations, &exceptions))
}

/// The sources that encode §A and so must tag each of its steps: the
/// checker's model and the real cache.
pub const STEP_DIRS: [&str; 2] = ["checker/src", "impl/src"];

/// What [`check_steps`] found.
#[derive(Debug, Default)]
pub struct Steps {
    /// How many steps spec.md's §A table has.
    pub count: usize,
    /// For each of [`STEP_DIRS`], the steps its `.rs` files do not tag.
    pub untagged: Vec<(&'static str, Vec<String>)>,
}

/// Whether every step of §A is tagged in each of [`STEP_DIRS`] under `root`.
pub fn check_steps(root: &Path) -> Result<Steps, String> {
    let spec = std::fs::read_to_string(root.join("spec.md")).map_err(|e| format!("spec.md: {e}"))?;
    let mut untagged = Vec::new();
    for dir in STEP_DIRS {
        let source = read_rust_sources(&root.join(dir)).map_err(|e| format!("{dir}: {e}"))?;
        untagged.push((dir, missing_step_ids(&spec, &source)));
    }
    Ok(Steps { count: step_ids_in_spec(&spec).len(), untagged })
}

/// The step IDs of the table in spec.md's "## A" section, in table order.
pub fn step_ids_in_spec(spec: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut in_a = false;
    for line in spec.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            in_a = h.starts_with("A ") || h == "A";
            continue;
        }
        if !in_a {
            continue;
        }
        let Some(row) = line.trim().strip_prefix('|') else { continue };
        let Some(cell) = row.split('|').next().map(str::trim) else { continue };
        let is_id = !cell.is_empty()
            && cell.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && cell.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && cell.chars().any(|c| c.is_ascii_digit() || c == '-');
        if is_id && !ids.iter().any(|i| i == cell) {
            ids.push(cell.to_string());
        }
    }
    ids
}

/// Whether `source` holds a tag line `//= spec.md#<id>` (exactly that ID:
/// `A10` is not a tag for `A1`). Mentions in prose do not count.
pub fn has_tag(source: &str, id: &str) -> bool {
    let needle = format!("//= spec.md#{id}");
    source.match_indices(&needle).any(|(i, _)| {
        let next = source[i + needle.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// The step IDs of spec.md's §A table that `source` does not tag.
pub fn missing_step_ids(spec: &str, source: &str) -> Vec<String> {
    step_ids_in_spec(spec).into_iter().filter(|id| !has_tag(source, id)).collect()
}

/// The text of every `.rs` file under `dir` (recursively), concatenated.
pub fn read_rust_sources(dir: &Path) -> std::io::Result<String> {
    let mut out = String::new();
    for p in source_files(dir, &["."])? {
        if p.extension().is_some_and(|x| x == "rs") {
            out += &std::fs::read_to_string(&p)?;
            out.push('\n');
        }
    }
    Ok(out)
}

/// The sources of the loom models that the coverage table may name.
pub const LOOM_SOURCES: [&str; 2] = ["impl/tests/loom.rs", "capi/src/slab/models.rs"];

/// Where the names of every mutant (checker, fault switch, slab) are.
pub const MUTANTS_FILE: &str = "types/src/mutants.rs";

/// The directories (and files) whose sources with an atomic must each be
/// named by a row of the coverage table.
pub const ATOMIC_DIRS: [&str; 4] = ["impl/src/cache", "impl/src/monitor", "impl/src/sync.rs", "capi/src"];

/// The checker's encoding of §A, where a row's model steps must be tagged.
pub const MODEL_STEP_DIR: &str = "checker/src/algo";

/// One row of spec.md's coverage table ("Coverage of the mechanisms").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoverageRow {
    /// The row's line in spec.md.
    pub line: usize,
    pub mechanism: String,
    /// Source files.
    pub code: Vec<String>,
    /// §A step IDs (empty for a "tests only" row).
    pub steps: Vec<String>,
    /// "tests only": no model step; the files named are the tests.
    pub tests_only: Option<Vec<String>>,
    /// Loom test functions.
    pub loom: Vec<String>,
    pub mutants: Vec<String>,
}

/// The names written in backticks in `cell`.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The rows between `<!-- coverage -->` and `<!-- /coverage -->` in spec.md.
pub fn coverage_rows(spec: &str) -> Result<Vec<CoverageRow>, String> {
    let mut rows = Vec::new();
    let mut inside = false;
    let mut seen = false;
    for (n, line) in spec.lines().enumerate() {
        match line.trim() {
            "<!-- coverage -->" => {
                inside = true;
                seen = true;
                continue;
            }
            "<!-- /coverage -->" => {
                inside = false;
                continue;
            }
            _ => {}
        }
        let Some(row) = line.trim().strip_prefix("| ").filter(|_| inside) else { continue };
        let cells: Vec<&str> = row.trim_end_matches('|').split(" | ").map(str::trim).collect();
        if cells.first() == Some(&"mechanism") {
            continue;
        }
        let [mechanism, code, steps, loom, mutants] = cells[..] else {
            return Err(format!("spec.md:{}: a coverage row has 5 cells, this one {}", n + 1, cells.len()));
        };
        // `none`, or `none (why)`: the reason names nothing to check.
        let none = |c: &str| c == "none" || c.starts_with("none (");
        let tests_only = steps.starts_with("tests only").then(|| backticked(steps));
        rows.push(CoverageRow {
            line: n + 1,
            mechanism: mechanism.to_string(),
            code: backticked(code),
            steps: if tests_only.is_some() || none(steps) { Vec::new() } else { backticked(steps) },
            tests_only,
            loom: if none(loom) { Vec::new() } else { backticked(loom) },
            mutants: if none(mutants) { Vec::new() } else { backticked(mutants) },
        });
        for (what, cell) in [("loom models", loom), ("mutants", mutants), ("model steps", steps)] {
            if !none(cell) && !cell.starts_with("tests only") && backticked(cell).is_empty() {
                return Err(format!("spec.md:{}: {what}: names in backticks, `none` or `tests only`", n + 1));
            }
        }
    }
    if !seen || inside {
        return Err("spec.md: no coverage table between <!-- coverage --> and <!-- /coverage -->".into());
    }
    Ok(rows)
}

/// Whether `source` uses an atomic type in code (comments aside).
pub fn has_atomic(source: &str) -> bool {
    source
        .lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with("//"))
        .any(|l| l.match_indices("Atomic").any(|(i, _)| l[i + 6..].chars().next().is_some_and(|c| c.is_ascii_uppercase())))
}

/// Whether `file` holds tests rather than a mechanism (test modules and the
/// loom models themselves).
fn is_test_source(file: &str) -> bool {
    file.ends_with("/tests.rs") || file.split('/').any(|c| c == "tests") || LOOM_SOURCES.contains(&file)
}

/// What [`check_coverage`] found.
#[derive(Debug, Default)]
pub struct Coverage {
    pub rows: usize,
    /// The source files with an atomic under [`ATOMIC_DIRS`].
    pub atomic_files: usize,
    pub problems: Vec<String>,
}

/// Checks the coverage table against the sources: every path, model step,
/// loom model and mutant it names exists, every row without a model step
/// and without a loom model says "tests only", and every source file with
/// an atomic under [`ATOMIC_DIRS`] is named by a row.
pub fn check_coverage_of(
    spec: &str,
    exists: &dyn Fn(&str) -> bool,
    model_source: &str,
    loom_source: &str,
    mutants_source: &str,
    atomic_files: &[String],
) -> Coverage {
    let rows = match coverage_rows(spec) {
        Ok(r) => r,
        Err(e) => return Coverage { problems: vec![e], ..Coverage::default() },
    };
    let steps = step_ids_in_spec(spec);
    let mut problems = Vec::new();
    let mut named = BTreeSet::new();
    for r in &rows {
        let at = format!("spec.md:{} ({})", r.line, r.mechanism);
        if r.code.is_empty() {
            problems.push(format!("{at}: names no code"));
        }
        for f in r.code.iter().chain(r.tests_only.iter().flatten()) {
            if !exists(f) {
                problems.push(format!("{at}: no file {f}"));
            }
            named.insert(f.as_str());
        }
        for id in &r.steps {
            if !steps.contains(id) {
                problems.push(format!("{at}: {id} is not a step of spec.md's §A table"));
            } else if !has_tag(model_source, id) {
                problems.push(format!("{at}: {id} is not tagged in {MODEL_STEP_DIR}"));
            }
        }
        for t in &r.loom {
            if !loom_source.contains(&format!("fn {t}(")) {
                problems.push(format!("{at}: no loom model {t} in {}", LOOM_SOURCES.join(" or ")));
            }
        }
        for m in &r.mutants {
            if !mutants_source.contains(&format!("\"{m}\"")) {
                problems.push(format!("{at}: no mutant {m} in {MUTANTS_FILE}"));
            }
        }
        if r.steps.is_empty() && r.loom.is_empty() && r.tests_only.is_none() {
            problems.push(format!("{at}: neither a model step nor a loom model: say \"tests only\""));
        }
    }
    for f in atomic_files {
        if !named.contains(f.as_str()) {
            problems.push(format!("{f}: has atomics and no row in spec.md's coverage table"));
        }
    }
    Coverage { rows: rows.len(), atomic_files: atomic_files.len(), problems }
}

/// [`check_coverage_of`] on the repository at `root`.
pub fn check_coverage(root: &Path) -> Result<Coverage, String> {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).map_err(|e| format!("{p}: {e}"));
    let spec = read("spec.md")?;
    let model = read_rust_sources(&root.join(MODEL_STEP_DIR)).map_err(|e| format!("{MODEL_STEP_DIR}: {e}"))?;
    let mut loom = String::new();
    for f in LOOM_SOURCES {
        loom += &read(f)?;
    }
    let mutants = read(MUTANTS_FILE)?;
    let mut atomic = Vec::new();
    for d in ATOMIC_DIRS {
        let files = if d.ends_with(".rs") { vec![root.join(d)] } else { source_files(root, &[d]).map_err(|e| format!("{d}: {e}"))? };
        for p in files {
            let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().into_owned();
            if !rel.ends_with(".rs") || is_test_source(&rel) {
                continue;
            }
            if has_atomic(&std::fs::read_to_string(&p).map_err(|e| format!("{rel}: {e}"))?) {
                atomic.push(rel);
            }
        }
    }
    Ok(check_coverage_of(&spec, &|f| root.join(f).exists(), &model, &loom, &mutants, &atomic))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Tags are built at run time so that this file holds none itself.
    fn tag(id: &str) -> String {
        format!("//= {}#{id}\n", "spec.md")
    }

    const SPEC: &str = "## S1 Vocabulary\n\n- **S1.1 Page.** The unit of pinning,\n  numbered `k`.\n- **P1 coverage.** A granted lease's registration *covers* the request.\n\n\
        C-rules: **C1** hit iff a findable entry\ncovers; **C2** a miss registers.\n\n## S8 Stats\n\nThe schema.\n\n\
        ## A The concurrent algorithm\n\n| step | what |\n|---|---|\n| A1 | x |\n| A10 | y |\n| A-D | z |\n## T Trace\n| T1 | no |\n";

    #[test]
    fn parses_the_items() {
        let items = spec_items(SPEC);
        let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["S1", "S1.1", "P1", "C1", "C2", "S8", "A", "A1", "A10", "A-D", "T", "T1"]);
        let req: Vec<&str> = items.iter().filter(|i| i.required).map(|i| i.id.as_str()).collect();
        assert_eq!(req, ["S1.1", "P1", "C1", "C2", "S8", "A1", "A10", "A-D", "T1"]);
        assert_eq!(normalize(&items[1].text), "S1.1 Page. The unit of pinning, numbered k.");
        assert_eq!(normalize(&items[3].text), "hit iff a findable entry covers;");
    }

    #[test]
    fn parses_the_table_and_respects_id_boundaries() {
        assert_eq!(step_ids_in_spec(SPEC), vec!["A1", "A10", "A-D"]);
        assert_eq!(missing_step_ids(SPEC, &(tag("A10") + &tag("A-D"))), vec!["A1"]);
        assert!(missing_step_ids(SPEC, &(tag("A1") + &tag("A10") + &tag("A-D"))).is_empty());
        assert!(!has_tag(&tag("A-DX"), "A-D"));
    }

    fn run(code: &str, test: &str, exceptions: &str) -> Report {
        let mut c = citations_in("impl/src/x.rs", code);
        c.extend(citations_in("impl/tests/x.rs", test));
        check_citations(&spec_items(SPEC), &c, &parse_exceptions(exceptions).unwrap())
    }

    const ALL: [&str; 9] = ["S1.1", "P1", "C1", "C2", "S8", "A1", "A10", "A-D", "T1"];

    #[test]
    fn a_verbatim_quote_passes_and_a_paraphrase_fails() {
        let all: String = ALL.iter().map(|i| tag(i)).collect();
        let verbatim = tag("P1") + "//# A granted lease's registration covers\n//# the request.\n";
        assert_eq!(run(&(all.clone() + &verbatim), &all, "").problems, vec![]);
        let paraphrase = tag("P1") + "//# A granted lease's registration contains the request.\n";
        let r = run(&(all.clone() + &paraphrase), &all, "");
        assert!(matches!(&r.problems[..], [Problem::NotVerbatim { id, .. }] if id == "P1"), "{:?}", r.problems);
        // Text of another item is no quote of this one.
        let elsewhere = tag("P1") + "//# The unit of pinning\n";
        assert_eq!(run(&(all.clone() + &elsewhere), &all, "").problems.len(), 1);
    }

    #[test]
    fn unknown_ids_and_uncited_items_fail_unless_excused() {
        let all: String = ALL.iter().map(|i| tag(i)).collect();
        let r = run(&(all.clone() + &tag("P9")), &all, "");
        assert!(matches!(&r.problems[..], [Problem::UnknownId { id, .. }] if id == "P9"), "{:?}", r.problems);
        let no_s8: String = ALL.iter().filter(|i| **i != "S8").map(|i| tag(i)).collect();
        let r = run(&all, &no_s8, "");
        assert_eq!(r.problems, vec![Problem::Uncited { id: "S8".into(), missing: Missing::Test }]);
        let r = run(&all, &no_s8, "S8 test: the schema is checked field by field elsewhere\n");
        assert_eq!((r.problems.len(), r.exceptions), (0, 1));
        // Stale, wrong or reason-sharing exceptions fail.
        assert_eq!(run(&all, &all, "S8 test: the schema is checked field by field elsewhere\n").problems.len(), 1);
        assert_eq!(run(&all, &no_s8, "S8 code: the schema is checked field by field elsewhere\n").problems.len(), 1);
        let two = "S8 test: same reason for both of them\nT1 code+test: same reason for both of them\n";
        let no_t1: String = ALL.iter().filter(|i| **i != "S8" && **i != "T1").map(|i| tag(i)).collect();
        let code_no_t1: String = ALL.iter().filter(|i| **i != "T1").map(|i| tag(i)).collect();
        assert_eq!(run(&code_no_t1, &no_t1, two).problems.len(), 1);
    }

    #[test]
    fn a_citation_marked_type_test_counts_for_tests() {
        let src = tag("P1").replace('\n', " type=test\n") + "//# A granted lease's registration covers\n" + &tag("C1");
        let c = citations_in("checker/src/x.rs", &src);
        let got: Vec<_> = c.iter().map(|c| (c.id.as_str(), c.test, c.quote.is_some())).collect();
        assert_eq!(got, [("P1", true, true), ("C1", false, false)]);
        assert!(has_tag(&src, "P1"), "still a tag of its step");
    }

    #[test]
    fn citations_after_cfg_test_count_for_tests() {
        let src = tag("P1") + "#[cfg(test)]\nmod tests {\n" + &tag("C1") + "}\n";
        let c = citations_in("types/src/lib.rs", &src);
        assert_eq!(c.iter().map(|c| (c.id.as_str(), c.test)).collect::<Vec<_>>(), [("P1", false), ("C1", true)]);
    }

    const COVERAGE: &str =
        "## A The concurrent algorithm\n\n| step | what |\n|---|---|\n| A1 | x |\n| R1 | y |\n\n## Coverage\n\n<!-- coverage -->\n\
        | mechanism | code | model steps | loom models | mutants |\n|---|---|---|---|---|\n\
        | the hit | `a.rs` | `A1` | `hit_vs_release` | `no-recheck` |\n\
        | counters | `b.rs` | tests only (`t.rs`) | none | none |\n<!-- /coverage -->\n";

    fn coverage(spec: &str, model: &str, loom: &str, mutants: &str, atomic: &[&str]) -> Vec<String> {
        let files = ["a.rs", "b.rs", "t.rs"];
        let atomic: Vec<String> = atomic.iter().map(|s| s.to_string()).collect();
        check_coverage_of(spec, &|f| files.contains(&f), model, loom, mutants, &atomic).problems
    }

    #[test]
    fn the_coverage_table_names_what_exists() {
        let (model, loom, mutants) = (tag("A1") + &tag("R1"), "fn hit_vs_release() {}", "[\"no-recheck\"]");
        assert_eq!(coverage(COVERAGE, &model, loom, mutants, &["a.rs", "b.rs"]), Vec::<String>::new());
        // A step not tagged in the model, a loom model or a mutant that is gone.
        assert_eq!(coverage(COVERAGE, &tag("R1"), loom, mutants, &[]).len(), 1);
        assert_eq!(coverage(COVERAGE, &model, "fn hit_vs_release_2() {}", mutants, &[]).len(), 1);
        assert_eq!(coverage(COVERAGE, &model, loom, "[\"no-recheck-2\"]", &[]).len(), 1);
        // A new file with atomics and no row; a file that is not there.
        assert_eq!(coverage(COVERAGE, &model, loom, mutants, &["c.rs"]).len(), 1);
        assert_eq!(coverage(&COVERAGE.replace("`b.rs`", "`d.rs`"), &model, loom, mutants, &[]).len(), 1);
        // A row with no model at all must say so.
        let silent = COVERAGE.replace("tests only (`t.rs`)", "none");
        assert_eq!(coverage(&silent, &model, loom, mutants, &[]).len(), 1);
        let said = COVERAGE.replace("tests only (`t.rs`)", "none (no step counts: `x.rs`)");
        assert_eq!(coverage(&said, &model, loom, mutants, &[]).len(), 1, "a reason is no model");
        // A reason in a cell names nothing: `x.rs` need not exist.
        let said = said.replace("| none | none |", "| `hit_vs_release` | none (a reason: `x`) |");
        assert_eq!(coverage(&said, &model, loom, mutants, &[]), Vec::<String>::new());
        assert_eq!(coverage("no table", &model, loom, mutants, &[]).len(), 1);
    }

    #[test]
    fn atomics_in_code_count_and_in_comments_do_not() {
        assert!(has_atomic("use std::sync::atomic::{AtomicU64, Ordering};"));
        assert!(has_atomic("    len: sync::AtomicU32,"));
        assert!(!has_atomic("// an AtomicU64 would do\n/// see AtomicPtr\nlet atomic = 1;"));
        assert!(is_test_source("impl/src/monitor/uffd/tests.rs") && is_test_source("capi/src/slab/models.rs"));
        assert!(!is_test_source("capi/src/slab.rs"));
    }
}
