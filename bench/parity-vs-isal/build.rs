//! Links the system ISA-L (Debian: libisal-dev; bench/parity-vs-isal.sh installs it).
fn main() {
    println!("cargo:rustc-link-lib=isal");
    println!("cargo:rerun-if-changed=build.rs");
}
