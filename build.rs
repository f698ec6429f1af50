//! Build script: the schema's migrations are listed for `db::migrations` to embed (rebuild when
//! they change), the libtorch shim (`csrc/`) is compiled, and the binary is linked so that
//! libtorch's CUDA backend is really loaded.
//!
//! tch links `libtorch_cuda` with `--as-needed`; as no symbol of it is referenced directly, the linker
//! drops it and CUDA is silently unavailable at run time. When the libtorch in use ships
//! `libtorch_cuda.so`, force it in. An rpath to libtorch lets the binary run here without
//! `LD_LIBRARY_PATH` (which still takes precedence, e.g. on the GPU machine).
use std::path::PathBuf;

/// Compiles `csrc/torch_shim.cpp`, `aoti.cpp` and `profiler.cpp` against the headers of the
/// libtorch tch links.
fn build_shim(lib: &std::path::Path) {
    println!("cargo:rerun-if-changed=csrc/torch_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/aoti.cpp");
    println!("cargo:rerun-if-changed=csrc/profiler.cpp");
    println!("cargo:rerun-if-changed=csrc/guarded.h");
    let include = lib.join("..").join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/torch_shim.cpp")
        .file("csrc/aoti.cpp")
        .file("csrc/profiler.cpp")
        .include(&include)
        .include(include.join("torch").join("csrc").join("api").join("include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false)
        .compile("voxbatch_torch_shim");
}

/// Compiles `csrc/cuda_graph.cpp` and `csrc/cuda_stream.cpp` where the CUDA runtime headers are (the cu13 torch wheel ships
/// them under `site-packages/nvidia/cu13/include`) and tells the Rust side so; without them,
/// CUDA graphs are reported unavailable and decoding runs eagerly.
fn build_cuda_graphs(lib: &std::path::Path) {
    println!("cargo:rerun-if-changed=csrc/cuda_graph.cpp");
    println!("cargo:rerun-if-changed=csrc/cuda_stream.cpp");
    let include = lib.join("..").join("include");
    let cuda = lib.join("..").join("..").join("nvidia").join("cu13").join("include");
    if !cuda.join("cuda_runtime_api.h").exists() || !include.join("ATen").join("cuda").join("CUDAGraph.h").exists() {
        println!("cargo:warning=no CUDA runtime headers next to libtorch: CUDA graphs disabled");
        return;
    }
    // cuda_runtime.h needs crt/host_config.h, which the runtime wheel lacks; triton (a torch
    // dependency) ships it with the CUDA headers its compiler uses.
    let crt = lib.join("..").join("..").join("triton").join("backends").join("nvidia").join("include");
    if !cuda.join("crt").join("host_config.h").exists() && !crt.join("crt").join("host_config.h").exists() {
        println!("cargo:warning=no crt/host_config.h (CUDA headers) next to libtorch: CUDA graphs disabled");
        return;
    }
    cc::Build::new()
        .cpp(true)
        .file("csrc/cuda_graph.cpp")
        .file("csrc/cuda_stream.cpp")
        .include(&include)
        .include(include.join("torch").join("csrc").join("api").join("include"))
        .include(&cuda)
        .include(&crt)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .warnings(false)
        .compile("voxbatch_cuda_graph");
    println!("cargo:rustc-cfg=voxbatch_cuda_graphs");
}

/// `OUT_DIR/migrations.rs`: a slice of (version, description, SQL text) for each file of
/// `migrations/`, named as sqlx's `migrate!` reads them (`<version>_<description>.sql`, the
/// description's `_` read as spaces), in version order; the text by `include_str!`, so the binary
/// carries it. A file that does not follow that form fails the build, naming it.
fn list_migrations() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("migrations");
    let mut found: Vec<(i64, String, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display())) {
        let path = entry.unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display())).path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !path.is_file() || !name.ends_with(".sql") {
            continue;
        }
        let parsed = name.split_once('_').and_then(|(version, rest)| Some((version.parse::<i64>().ok()?, rest.strip_suffix(".sql")?)));
        let Some((version, description)) = parsed else {
            panic!("migrations/{name}: not <version>_<description>.sql (an integer version first)");
        };
        if description.ends_with(".up") || description.ends_with(".down") {
            panic!("migrations/{name}: reversible migrations are not embedded (db::migrations takes simple ones)");
        }
        found.push((version, description.replace('_', " "), path));
    }
    found.sort_by_key(|(version, _, _)| *version);
    let mut out = String::from("&[\n");
    for (version, description, path) in &found {
        out.push_str(&format!("    ({version}, {description:?}, include_str!({:?})),\n", path.display().to_string()));
    }
    out.push_str("]\n");
    let target = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("migrations.rs");
    std::fs::write(&target, out).unwrap_or_else(|e| panic!("cannot write {}: {e}", target.display()));
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(voxbatch_cuda_graphs)");
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=build.rs");
    list_migrations();
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    let lib = PathBuf::from(lib);
    build_shim(&lib);
    build_cuda_graphs(&lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-lc10_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
