//! Builds the PMPI recorder (`recorder/pmpi_shim.c`, which includes the parts
//! in `recorder/pmpi/`) into
//! `$OUT_DIR/libmrcache_pmpi.so`, which `mrcache record` embeds.
//!
//! The shim needs Open MPI's `mpi.h`. Without it the build still succeeds, and
//! `mrcache record` explains that libopenmpi-dev must be installed and the
//! crate rebuilt (cfg `mrcache_pmpi` is then absent).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(mrcache_pmpi)");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=recorder/pmpi_shim.c");
    println!("cargo:rerun-if-changed=recorder/pmpi");
    println!("cargo:rerun-if-env-changed=MPICC");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libmrcache_pmpi.so");

    let Some(flags) = mpi_flags() else {
        // Rebuild when Open MPI appears (its mpicc lands in /usr/bin).
        println!("cargo:rerun-if-changed=/usr/bin");
        println!(
            "cargo:warning=mpi.h not found (no mpicc, no pkg-config ompi): `mrcache record` is disabled; \
             install libopenmpi-dev and rebuild"
        );
        return;
    };
    println!("cargo:rerun-if-changed={}", flags.header.display());

    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args([
        "-shared",
        "-fPIC",
        "-O2",
        "-g",
        "-Wall",
        "-Wextra",
        "-ftls-model=initial-exec",
        // The shim defines malloc & co: the compiler must not turn code into calls to them.
        "-fno-builtin-malloc",
        "-fno-builtin-calloc",
        "-fno-builtin-realloc",
        "-fno-builtin-free",
    ]);
    cmd.args(&flags.compile).arg("recorder/pmpi_shim.c").arg("-o").arg(&so).args(&flags.link).arg("-ldl");
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run the C compiler {:?}: {e}", compiler.path()));
    assert!(status.success(), "building recorder/pmpi_shim.c failed: {cmd:?}");
    println!("cargo:rustc-cfg=mrcache_pmpi");
}

struct MpiFlags {
    compile: Vec<String>,
    link: Vec<String>,
    header: PathBuf,
}

/// Open MPI's compile and link flags, from `mpicc --showme` or `pkg-config ompi`,
/// if they lead to an `mpi.h`.
fn mpi_flags() -> Option<MpiFlags> {
    let mpicc = env::var("MPICC").unwrap_or_else(|_| "mpicc".into());
    let from_mpicc = run(&mpicc, &["--showme:compile"]).zip(run(&mpicc, &["--showme:link"]));
    let (compile, link) = from_mpicc.or_else(|| run("pkg-config", &["--cflags", "ompi"]).zip(run("pkg-config", &["--libs", "ompi"])))?;
    let compile: Vec<String> = compile.split_whitespace().map(String::from).collect();
    let link: Vec<String> = link.split_whitespace().map(String::from).collect();
    let header = compile
        .iter()
        .filter_map(|f| f.strip_prefix("-I"))
        .map(|dir| Path::new(dir).join("mpi.h"))
        .find(|h| h.is_file())
        .or_else(|| Some(PathBuf::from("/usr/include/mpi.h")).filter(|h| h.is_file()))?;
    Some(MpiFlags { compile, link, header })
}

fn run(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
