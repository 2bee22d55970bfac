//! Names the commit the binary is built from, for `hourglass --version`:
//! `HOURGLASS_COMMIT` if set (the Docker build passes it, having no `.git`),
//! else `git rev-parse`, else "unknown". A dozen lines: a crate for it
//! (vergen) would bring a dependency tree for one git command.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=HOURGLASS_COMMIT");
    let commit = std::env::var("HOURGLASS_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // A new commit changes the ref HEAD points at (or HEAD itself, detached).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{head}");
        }
        println!("cargo:rerun-if-changed={dir}/packed-refs");
    }
    println!("cargo:rustc-env=HOURGLASS_COMMIT={}", commit.trim());
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}
