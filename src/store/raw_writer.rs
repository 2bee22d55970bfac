//! Writes BSON documents into one growing buffer, nested documents in place.
//!
//! Written by hand because the `bson` crate (2.x) appends a nested document
//! only as a finished `RawDocumentBuf`: each level is built in its own
//! buffer and copied into its parent, so a bucket statement was allocated
//! and copied once per level (eight times for the readings of a minute
//! bucket) and once more into its command. Here a document's length is left
//! blank when it opens and filled in when it closes, so a whole `update`
//! command is written once, in order, into the buffer the driver sends.

use mongodb::bson::{RawDocument, RawDocumentBuf};

// Element types of the BSON specification (bsonspec.org) used here.
const DOUBLE: u8 = 0x01;
const STRING: u8 = 0x02;
const DOCUMENT: u8 = 0x03;
const ARRAY: u8 = 0x04;
const BINARY: u8 = 0x05;
const BOOLEAN: u8 = 0x08;
const OBJECT_ID: u8 = 0x07;
const DATETIME: u8 = 0x09;
const NULL: u8 = 0x0A;
const INT32: u8 = 0x10;
const INT64: u8 = 0x12;

/// A document or array opened by [`Writer`], to be closed with [`Writer::end`].
#[must_use = "an opened document must be ended"]
#[derive(Debug)]
pub struct Open(usize);

/// A BSON byte buffer under construction.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> usize {
        self.buf.len()
    }

    /// Forgets everything written after `len`, e.g. a statement that did not fit.
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// Opens the top-level document.
    pub fn root(&mut self) -> Open {
        self.begin()
    }

    fn begin(&mut self) -> Open {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        Open(at)
    }

    /// Closes `open`: its terminator, then its length in its first bytes.
    pub fn end(&mut self, open: Open) {
        self.buf.push(0);
        let len = (self.buf.len() - open.0) as i32;
        self.buf[open.0..open.0 + 4].copy_from_slice(&len.to_le_bytes());
    }

    fn key(&mut self, kind: u8, key: &str) {
        // Keys here are this module's callers' constants and decimal indexes.
        debug_assert!(!key.as_bytes().contains(&0), "a BSON key holds no NUL");
        self.buf.push(kind);
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.push(0);
    }

    /// Opens a document as the value of `key`.
    pub fn document(&mut self, key: &str) -> Open {
        self.key(DOCUMENT, key);
        self.begin()
    }

    /// Opens an array as the value of `key`; its elements' keys are "0", "1"…
    pub fn array(&mut self, key: &str) -> Open {
        self.key(ARRAY, key);
        self.begin()
    }

    pub fn double(&mut self, key: &str, value: f64) {
        self.key(DOUBLE, key);
        self.buf.extend_from_slice(&value.to_le_bytes());
    }

    pub fn int32(&mut self, key: &str, value: i32) {
        self.key(INT32, key);
        self.buf.extend_from_slice(&value.to_le_bytes());
    }

    pub fn int64(&mut self, key: &str, value: i64) {
        self.key(INT64, key);
        self.buf.extend_from_slice(&value.to_le_bytes());
    }

    /// An integer as int32 when it fits, else int64: the shorter encoding.
    pub fn integer(&mut self, key: &str, value: i64) {
        match i32::try_from(value) {
            Ok(v) => self.int32(key, v),
            Err(_) => self.int64(key, value),
        }
    }

    /// Bytes as a generic (subtype 0) binary value.
    pub fn binary(&mut self, key: &str, value: &[u8]) {
        self.key(BINARY, key);
        self.buf
            .extend_from_slice(&(value.len() as i32).to_le_bytes());
        self.buf.push(0);
        self.buf.extend_from_slice(value);
    }

    pub fn null(&mut self, key: &str) {
        self.key(NULL, key);
    }

    pub fn boolean(&mut self, key: &str, value: bool) {
        self.key(BOOLEAN, key);
        self.buf.push(u8::from(value));
    }

    pub fn object_id(&mut self, key: &str, value: &mongodb::bson::oid::ObjectId) {
        self.key(OBJECT_ID, key);
        self.buf.extend_from_slice(&value.bytes());
    }

    pub fn datetime(&mut self, key: &str, millis: i64) {
        self.key(DATETIME, key);
        self.buf.extend_from_slice(&millis.to_le_bytes());
    }

    /// A UTF-8 string value (it may hold any character: it is length-prefixed).
    pub fn string(&mut self, key: &str, value: &str) {
        self.key(STRING, key);
        self.buf
            .extend_from_slice(&(value.len() as i32 + 1).to_le_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
    }

    /// A finished document as the value of `key`, copied as it is.
    pub fn raw_document(&mut self, key: &str, value: &RawDocument) {
        self.key(DOCUMENT, key);
        self.buf.extend_from_slice(value.as_bytes());
    }

    /// The finished top-level document. Fails if it was left open (a bug in
    /// the caller).
    pub fn finish(self) -> Result<RawDocumentBuf, mongodb::bson::raw::Error> {
        RawDocumentBuf::from_bytes(self.buf)
    }
}

/// The decimal key of array element `i`, written into `buf`.
pub fn index_key(i: usize, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    let mut n = i;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}

#[cfg(test)]
mod tests {
    use mongodb::bson::{DateTime, rawdoc};

    use super::*;

    #[test]
    fn nested_documents_are_encoded_like_the_bson_crate_does() {
        let inner = rawdoc! { "$ifNull": ["$v", {}] };
        let token = mongodb::bson::oid::ObjectId::new();
        let mut w = Writer::default();
        let root = w.root();
        let q = w.document("q");
        w.string("sensor", "truck-1 é\0x");
        w.datetime("start", 1_700_000_000_000);
        w.end(q);
        let u = w.array("u");
        w.raw_document("0", &inner);
        let d = w.document("1");
        w.double("7", -2.5);
        w.int32("schema_version", 1);
        w.end(d);
        w.end(u);
        w.boolean("upsert", true);
        w.object_id("t", &token);
        w.end(root);
        let built = w.finish().expect("closed");
        let expected = rawdoc! {
            "q": { "sensor": "truck-1 é\0x", "start": DateTime::from_millis(1_700_000_000_000) },
            "u": [ inner, { "7": -2.5, "schema_version": 1 } ],
            "upsert": true,
            "t": token,
        };
        assert_eq!(built.as_bytes(), expected.as_bytes());
    }

    #[test]
    fn a_document_left_open_is_refused() {
        let mut w = Writer::default();
        let _root = w.root();
        w.double("x", 1.0);
        assert!(w.finish().is_err());
    }

    #[test]
    fn truncating_forgets_an_element() {
        let mut w = Writer::default();
        let root = w.root();
        w.double("x", 1.0);
        let mark = w.written();
        w.string("y", "gone");
        w.truncate(mark);
        w.end(root);
        let expected = rawdoc! { "x": 1.0 };
        assert_eq!(w.finish().expect("closed").as_bytes(), expected.as_bytes());
    }

    #[test]
    fn index_keys_are_decimal() {
        let mut buf = [0; 20];
        for i in [0, 9, 10, 59, 60, 99_999, 100_000, usize::MAX] {
            assert_eq!(index_key(i, &mut buf), i.to_string());
        }
    }
}
