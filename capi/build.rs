// The shared library's SONAME is the installed file's name (ci/install.sh
// installs libmrcache_capi.so as libmrcache.so), so programs linked with
// -lmrcache record `libmrcache.so` as what they need.
//
// src/escape.cc holds the callback trampolines (src/escape.rs): C++, because
// they catch a callback's exceptions; the cc crate links libstdc++ for it
// (and rustc lists it among a static link's native libraries).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmrcache.so");
    println!("cargo:rerun-if-changed=src/escape.cc");
    cc::Build::new()
        .cpp(true)
        .file("src/escape.cc")
        .flag("-std=c++17")
        .flag("-fexceptions")
        .flag("-Wall")
        .flag("-Wextra")
        .warnings_into_errors(true)
        .compile("mrcache_escape");
}
