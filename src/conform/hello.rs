//! The adapter's hello reply: its identity, declared policy, page size,
//! capabilities, access classes, arena and limits. A reply that speaks
//! another protocol version, or offers an arena that is not page-aligned or
//! smaller than [`MIN_ARENA`], is a `protocol` failure before any record is
//! sent.

use super::case::field_u64;
use super::{MIN_ARENA, PROTOCOL};
use mrcache_model::{EvictionPolicy, Limits, OverlapPolicy};
use mrcache_types::{Access, Range};
use serde_json::Value;

pub(super) struct Hello {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) policy: Option<OverlapPolicy>,
    pub(super) page_size: u64,
    pub(super) caps: Vec<String>,
    /// The access sets the peer can register, smallest first; a request is
    /// judged as the smallest class that suffices (`access_field: false`: one
    /// class, every right).
    pub(super) access_classes: Option<Vec<Access>>,
    pub(super) arena: Range,
    pub(super) limits: Limits,
    pub(super) eviction: EvictionPolicy,
    /// The chunk a miss's registration is widened to (spec.md S6.2), in
    /// bytes: a power of two, a multiple of `page_size` (default: one page).
    pub(super) chunk_size: u64,
    /// The bound on deferred deregistration it declares (`l1_bound`).
    pub(super) l1_bound: super::gaps::L1Bound,
    /// The registrar behind the adapter's cache (`registrar`, optional):
    /// `io_uring` pins pages and moves data, `counting` only reports calls.
    pub(super) registrar: Option<String>,
}

pub(super) const ALL_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE).union(Access::REMOTE_ATOMIC);

pub(super) fn parse_hello(v: &Value, at: &str) -> Result<Hello, String> {
    let o = v.as_object().ok_or_else(|| format!("{at}: the hello reply is not an object"))?;
    let s = |k: &str| o.get(k).and_then(Value::as_str).map(String::from);
    if o.get("ok") != Some(&Value::Bool(true)) {
        return Err(format!("{at}: hello failed: {}", s("error").unwrap_or_else(|| v.to_string())));
    }
    match o.get("protocol").and_then(Value::as_u64) {
        Some(PROTOCOL) => {}
        other => {
            let theirs = match (other, o.get("protocol")) {
                (Some(n), _) => format!("speaks {n}"),
                (None, None) => "gave no `protocol`".to_string(),
                (None, Some(x)) => format!("gave `protocol` {x}, not a version number"),
            };
            return Err(format!("{at}: field `protocol`: the runner speaks {PROTOCOL}, the adapter {theirs}"));
        }
    }
    let name = s("name").ok_or_else(|| format!("{at}: the hello reply needs `name`"))?;
    let version = s("version").unwrap_or_else(|| "?".into());
    let policy = match o.get("policy") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) => Some(p.parse::<OverlapPolicy>().map_err(|e| format!("{at}: field `policy`: {e}"))?),
        Some(x) => return Err(format!("{at}: field `policy`: expected a string or null, found {x}")),
    };
    let page_size = o.get("page_size").and_then(Value::as_u64).unwrap_or(4096);
    let caps = o
        .get("caps")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|c| c.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let access_field = o.get("access_field").and_then(Value::as_bool).unwrap_or(true);
    let mut access_classes = match o.get("access_classes") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|c| {
                    c.as_str()
                        .ok_or_else(|| format!("{at}: field `access_classes`: expected strings"))
                        .and_then(|s| s.parse::<Access>().map_err(|e| format!("{at}: field `access_classes`: {e}")))
                })
                .collect::<Result<Vec<Access>, String>>()?,
        ),
        Some(x) => return Err(format!("{at}: field `access_classes`: expected a list, found {x}")),
    };
    if !access_field {
        access_classes = Some(vec![ALL_ACCESS]);
    }
    if let Some(c) = access_classes.as_mut() {
        c.sort_by_key(|a| (a.bits().count_ones(), a.bits()));
    }
    let arena = o.get("arena").and_then(Value::as_object).ok_or_else(|| format!("{at}: the hello reply needs `arena` {{addr, len}}"))?;
    let addr = field_u64(arena, "addr", at).map_err(|e| e.to_string())?.ok_or_else(|| format!("{at}: arena.addr missing"))?;
    let len = field_u64(arena, "len", at).map_err(|e| e.to_string())?.ok_or_else(|| format!("{at}: arena.len missing"))?;
    if len < MIN_ARENA || addr % page_size != 0 {
        return Err(format!("{at}: field `arena`: needs a page-aligned arena of at least {MIN_ARENA} bytes, got {addr:#x}+{len:#x}"));
    }
    let arena = Range::new(addr, len).map_err(|e| format!("{at}: field `arena`: {e}"))?;
    let lim = o.get("limits").and_then(Value::as_object).cloned().unwrap_or_default();
    let limits = Limits {
        max_regions: field_u64(&lim, "max_regions", at).map_err(|e| e.to_string())?,
        max_pinned_bytes: field_u64(&lim, "max_pinned_bytes", at).map_err(|e| e.to_string())?,
        max_unreleased: Some(Limits::DEFAULT_MAX_UNRELEASED),
    };
    let eviction = match s("eviction") {
        None => EvictionPolicy::Lru,
        Some(e) => e.parse().map_err(|e| format!("{at}: field `eviction`: {e}"))?,
    };
    let chunk_size = super::gaps::hello_chunk_size(o, page_size, at)?;
    let l1_bound = super::gaps::hello_l1_bound(o, at)?;
    let registrar = match o.get("registrar") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) => Some(r.clone()),
        Some(x) => return Err(format!("{at}: field `registrar`: expected a string (e.g. \"io_uring\", \"counting\"), found {x}")),
    };
    Ok(Hello { name, version, policy, page_size, caps, access_classes, arena, limits, eviction, chunk_size, l1_bound, registrar })
}
