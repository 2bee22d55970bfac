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
    // Only paths that exist: cargo takes a missing one as always changed,
    // and would rebuild the crate on every command.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
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
