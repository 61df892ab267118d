//! Links the cdylib as rdma-core's `libibverbs.so.1`.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=ibverbs.map");
    // Programs name the library by soname; a symlink under that name finds this one.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    // Declares the version nodes; `.symver` directives (src/exports.rs) put the symbols in them.
    // This needs lld: GNU ld refuses it alongside the anonymous version script rustc passes
    // ("anonymous version tag cannot be combined with other version tags"). rustc links with
    // its own rust-lld by default on x86_64 Linux since 1.90, hence the package's rust-version.
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/ibverbs.map");
}
