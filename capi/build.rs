// The shared library's SONAME is the installed file's name (ci/install.sh
// installs libmrcache_capi.so as libmrcache.so), so programs linked with
// -lmrcache record `libmrcache.so` as what they need.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmrcache.so");
}
