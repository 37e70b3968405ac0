//! Traceability: every step of spec.md's §A table must be tagged in code with
//! a comment line `//= spec.md#<ID>`. The checker's test scans `checker/src`; the same
//! functions serve the implementation's test.

use std::path::Path;

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
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            out += &read_rust_sources(&p)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out += &std::fs::read_to_string(&p)?;
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_table_and_respects_id_boundaries() {
        // Built at run time so that this file holds no tag itself.
        let tag = |id: &str| format!("//= {}#{id}\n", "spec.md");
        let spec = "## S1 x\n| A9 | no |\n## A The concurrent algorithm\n\n| step | what |\n|---|---|\n| A1 | x |\n| A10 | y |\n| A-D | z |\n## T Trace\n| T1 | no |\n";
        assert_eq!(step_ids_in_spec(spec), vec!["A1", "A10", "A-D"]);
        assert_eq!(missing_step_ids(spec, &(tag("A10") + &tag("A-D"))), vec!["A1"]);
        assert!(missing_step_ids(spec, &(tag("A1") + &tag("A10") + &tag("A-D"))).is_empty());
        assert!(!has_tag(&tag("A-DX"), "A-D"));
    }
}
