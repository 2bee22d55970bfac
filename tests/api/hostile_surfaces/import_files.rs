//! Import files, each refused line by line or whole.

use super::cases::nested;

/// Import files: each refused line by line or whole, nothing stored.
pub fn files(dir: &std::path::Path) -> Vec<(&'static str, std::path::PathBuf)> {
    let write = |name: &str, body: Vec<u8>| {
        let path = dir.join(name);
        std::fs::write(&path, body).expect("written");
        path
    };
    vec![
        (
            "import: a binary file as CSV",
            write("binary.csv", (0..=255u8).cycle().take(1 << 16).collect()),
        ),
        (
            "import: CSV rows that are all wrong",
            write(
                "wrong.csv",
                b"sensor,ts,value\n$gt,yesterday,x\n,,\ns1,1,NaN\n".to_vec(),
            ),
        ),
        (
            "import: NDJSON lines nested 50 000 deep",
            write(
                "deep.ndjson",
                format!(
                    "{}\n{}\n",
                    nested("[", "", "]", 50_000),
                    nested("{\"a\":", "1", "}", 50_000)
                )
                .into_bytes(),
            ),
        ),
        (
            // 64 MiB of one line in 64 KiB: read whole, it was held whole.
            "import: a gzipped NDJSON line of 64 MiB without a line end",
            write("endless.ndjson.gz", {
                use std::io::Write;
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                let chunk = vec![b'x'; 1 << 20];
                for _ in 0..64 {
                    gz.write_all(&chunk).expect("compressed");
                }
                gz.finish().expect("compressed")
            }),
        ),
        (
            "import: line protocol with a 1 MiB measurement",
            write(
                "long.lp",
                format!("{} value=1\n", "m".repeat(1 << 20)).into_bytes(),
            ),
        ),
    ]
}
