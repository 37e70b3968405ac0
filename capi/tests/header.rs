//! include/mrcache.h is what the pinned cbindgen generates from src/ now.
//! `MRCACHE_BLESS_HEADER=1` rewrites it instead of failing.

use std::path::Path;

#[test]
fn checked_in_header_is_fresh() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("capi/cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new().with_crate(dir).with_config(config).generate().expect("cbindgen generates the header").write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("utf-8 header");
    let path = dir.join("include/mrcache.h");
    if std::env::var_os("MRCACHE_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/mrcache.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "capi/include/mrcache.h is stale: regenerate it with\n  MRCACHE_BLESS_HEADER=1 cargo test -p mrcache-capi --test header\n(first differing line: {:?})",
        checked_in.lines().zip(fresh.lines()).find(|(a, b)| a != b)
    );
}
