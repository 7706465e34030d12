//! Whole records of a text file (json lines, csv), read in chunks, and the
//! byte ranges that let several subtasks read one file.
//!
//! A record is a line; in CSV, a line break inside a quoted field
//! continues the record (RFC 4180), so a record may span lines. Quotes are
//! read as the CSV decoder (csv_core) reads them: a quote opens a quoted
//! field only at the start of a field; inside one, a quote closes it and
//! `""` is a quote; elsewhere (`6" pipe`) a quote is a character. Records
//! are handed out in chunks of contiguous bytes, one allocation a chunk
//! (not one per line), which the decoder reads whole.
//!
//! A byte range starts at a record boundary: the first record starting at
//! or after `size * i / n`, found by one pass over the bytes before it
//! that follows the quotes (by the same rules, visiting only the quote
//! characters). JSON strings cannot hold a raw line break, so any line
//! break is a boundary there. So a range reads exactly the records that start
//! in it, and the ranges together read the file's records once each.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

/// One record of a chunk.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// The file's line number of its first line (1-based).
    pub number: u64,
    /// The file offset of its first byte.
    pub byte_offset: u64,
    /// Its bytes in [`Chunk::text`], without the line terminator.
    pub span: Range<usize>,
    /// Physical lines it takes (more than one: line breaks in quotes).
    pub lines: u64,
}

/// Contiguous records as they were in the file, terminators included.
#[derive(Debug, Default)]
pub struct Chunk {
    pub text: Vec<u8>,
    pub records: Vec<RawRecord>,
}

impl Chunk {
    pub fn lines(&self) -> u64 {
        self.records.iter().map(|r| r.lines).sum()
    }

    pub fn bytes(&self, r: &RawRecord) -> &[u8] {
        &self.text[r.span.clone()]
    }
}

/// How a CSV file quotes: its quote character and field delimiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvQuoting {
    pub quote: u8,
    pub delimiter: u8,
}

/// Whether the reader is inside a quoted field, as csv_core decides it.
#[derive(Debug, Clone, Copy, Default)]
struct QuoteState {
    open: bool,
    /// Where the last quoted field closed: a quote right after it is an
    /// escaped quote (`""`), which reopens it.
    last_close: Option<u64>,
}

impl QuoteState {
    /// A quote character at `at`, after the byte `prev` (`\n` at the
    /// start of a record).
    fn quote(&mut self, q: CsvQuoting, prev: u8, at: u64) {
        if self.open {
            self.open = false;
            self.last_close = Some(at);
        } else if prev == q.delimiter || prev == b'\n' || prev == b'\r' || self.last_close == at.checked_sub(1) {
            self.open = true;
        }
    }

    /// Every quote character of `data[from..to]`; `base` is the offset of
    /// `data[0]` and `prev0` the byte before it.
    fn scan(&mut self, q: CsvQuoting, data: &[u8], from: usize, to: usize, base: u64, prev0: u8) {
        for i in memchr::memchr_iter(q.quote, &data[from..to]) {
            let p = from + i;
            let prev = if p == 0 { prev0 } else { data[p - 1] };
            self.quote(q, prev, base + p as u64);
        }
    }
}

/// Reads records from a byte range of a file.
pub struct RecordReader {
    file: File,
    buf: Vec<u8>,
    /// `buf[pos..len]` is read but not handed out.
    pos: usize,
    len: usize,
    /// Bytes of the range not read into `buf` yet.
    remaining: u64,
    /// CSV: records continue over line breaks inside quotes.
    csv: Option<CsvQuoting>,
    /// The file offset of `buf[pos]` and the line number of its line.
    offset: u64,
    line: u64,
}

const READ_SIZE: usize = 1 << 20;

impl RecordReader {
    /// Reads `range` of `file`; `first_line` is the line number (0-based)
    /// at `range.start`.
    pub fn open(mut file: File, range: Range<u64>, first_line: u64, csv: Option<CsvQuoting>) -> std::io::Result<Self> {
        if range.start > 0 {
            file.seek(SeekFrom::Start(range.start))?;
        }
        Ok(Self {
            file,
            buf: vec![0; READ_SIZE],
            pos: 0,
            len: 0,
            remaining: range.end - range.start,
            csv,
            offset: range.start,
            line: first_line,
        })
    }

    #[cfg(test)]
    fn with_buffer(mut self, size: usize) -> Self {
        self.buf = vec![0; size];
        self
    }

    /// Refills the buffer, keeping `buf[pos..len]`; false at the end.
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.remaining == 0 {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.len, 0);
            self.len -= self.pos;
            self.pos = 0;
        }
        if self.len == self.buf.len() {
            // One record longer than the buffer: grow.
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let want = (self.buf.len() - self.len).min(self.remaining.min(usize::MAX as u64) as usize);
        let n = loop {
            match self.file.read(&mut self.buf[self.len..self.len + want]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            self.remaining = 0;
            return Ok(false);
        }
        self.len += n;
        self.remaining -= n as u64;
        Ok(true)
    }

    /// The end of the record starting at `buf[start]` if it is complete in
    /// the buffer: (end of its text, start of the next, its lines).
    fn record_end(&self, start: usize, at_end: bool) -> Option<(usize, usize, u64)> {
        let data = &self.buf[..self.len];
        let mut scan = start;
        let mut lines = 1;
        let mut quotes = QuoteState::default();
        loop {
            // The next line break or quote: most lines have no quote, and
            // are found in one search.
            let found = match self.csv {
                Some(q) => memchr::memchr2(b'\n', q.quote, &data[scan..]),
                None => memchr::memchr(b'\n', &data[scan..]),
            };
            let Some(at) = found.map(|i| scan + i) else {
                // The last record of the file may have no line break (an
                // open quote at the end of the file ends it too).
                return (at_end && start < self.len).then(|| (trim_cr(data, start, self.len), self.len, lines));
            };
            if data[at] != b'\n' {
                if let Some(q) = self.csv {
                    let prev = if at == start { b'\n' } else { data[at - 1] };
                    quotes.quote(q, prev, at as u64);
                }
                scan = at + 1;
                continue;
            }
            if !quotes.open {
                return Some((trim_cr(data, start, at), at + 1, lines));
            }
            lines += 1;
            scan = at + 1;
        }
    }

    /// Up to `max_records` records, stopping once `max_lines` lines are
    /// read; an empty chunk at the end of the range.
    pub fn read(&mut self, max_records: usize, max_lines: u64) -> std::io::Result<Chunk> {
        let mut chunk = Chunk::default();
        let mut lines = 0;
        let mut at_end = false;
        let mut start = self.pos;
        let mut pending = 0;
        while chunk.records.len() < max_records && lines < max_lines {
            match self.record_end(start, at_end) {
                Some((text_end, next, n)) => {
                    chunk.records.push(RawRecord {
                        number: self.line + lines + 1,
                        byte_offset: self.offset + (start - self.pos) as u64,
                        span: start..text_end,
                        lines: n,
                    });
                    lines += n;
                    start = next;
                }
                None if at_end => break,
                None => {
                    // Hand out what is complete, keep the partial record.
                    self.take(&mut chunk, start, &mut pending);
                    at_end = !self.fill()?;
                    start = self.pos;
                }
            }
        }
        self.take(&mut chunk, start, &mut pending);
        self.line += lines;
        Ok(chunk)
    }

    /// Moves `buf[pos..upto]` (whole records) into `chunk`; the records
    /// from `pending` on still index the buffer and are moved with it.
    fn take(&mut self, chunk: &mut Chunk, upto: usize, pending: &mut usize) {
        let base = chunk.text.len();
        for r in &mut chunk.records[*pending..] {
            r.span = (r.span.start - self.pos + base)..(r.span.end - self.pos + base);
        }
        *pending = chunk.records.len();
        chunk.text.extend_from_slice(&self.buf[self.pos..upto]);
        self.offset += (upto - self.pos) as u64;
        self.pos = upto;
    }
}

fn trim_cr(data: &[u8], start: usize, end: usize) -> usize {
    if end > start && data[end - 1] == b'\r' {
        end - 1
    } else {
        end
    }
}

/// Where the first `need` of `n` byte ranges of a file start, from one
/// pass over the bytes before the last. Only quote characters are counted
/// (with memchr: a file without quotes is scanned at memory speed); line
/// numbers are [`lines_before`]'s, asked only when a record is reported.
pub fn range_starts(path: &Path, n: usize, need: usize, csv: Option<CsvQuoting>) -> std::io::Result<Vec<u64>> {
    range_starts_with(path, n, need, csv, READ_SIZE)
}

fn range_starts_with(
    path: &Path,
    n: usize,
    need: usize,
    csv: Option<CsvQuoting>,
    buf_size: usize,
) -> std::io::Result<Vec<u64>> {
    let n = n.max(1);
    let need = need.clamp(1, n);
    let mut file = File::open(path)?;
    let size = file.metadata()?.len();
    let targets: Vec<u64> = (0..n).map(|i| size * i as u64 / n as u64).collect();
    let mut starts = vec![0u64];
    let mut buf = vec![0u8; buf_size];
    let mut offset = 0u64;
    let mut quotes = QuoteState::default();
    // The byte before the buffer: the file starts a record.
    let mut prev0 = b'\n';
    let scan = |quotes: &mut QuoteState, data: &[u8], from: usize, to: usize, base: u64, prev0: u8| {
        if let Some(q) = csv {
            quotes.scan(q, data, from, to, base, prev0);
        }
    };
    let mut next = 1;
    while next < need {
        let got = file.read(&mut buf)?;
        if got == 0 {
            break;
        }
        let data = &buf[..got];
        let mut from = 0usize;
        while next < need {
            let target = targets[next];
            let end = offset + got as u64;
            // The search starts at `target - 1`: is it in this buffer?
            if target.saturating_sub(1) >= end {
                break;
            }
            // Count up to the target, then look for a line break outside
            // quotes at or after `target - 1` (a record starting exactly
            // at the target starts there).
            let t = (target.saturating_sub(1).max(offset) - offset) as usize;
            let t = t.max(from);
            scan(&mut quotes, data, from, t, offset, prev0);
            from = t;
            let mut found = None;
            while let Some(i) = memchr::memchr(b'\n', &data[from..]).map(|i| from + i) {
                scan(&mut quotes, data, from, i, offset, prev0);
                from = i + 1;
                if !quotes.open {
                    found = Some(offset + from as u64);
                    break;
                }
            }
            match found {
                Some(start) => {
                    // Several targets may fall in one record: they share it.
                    while next < need && targets[next] <= start {
                        starts.push(start);
                        next += 1;
                    }
                }
                None => break,
            }
        }
        if from < got {
            scan(&mut quotes, data, from, got, offset, prev0);
        }
        prev0 = data[got - 1];
        offset += got as u64;
    }
    while starts.len() < need {
        starts.push(size);
    }
    Ok(starts)
}

/// Line breaks in the first `offset` bytes of a file: the line number a
/// byte range starts after.
pub fn lines_before(path: &Path, offset: u64) -> std::io::Result<u64> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; READ_SIZE];
    let (mut left, mut lines) = (offset, 0u64);
    while left > 0 {
        let want = buf.len().min(left.min(usize::MAX as u64) as usize);
        let got = file.read(&mut buf[..want])?;
        if got == 0 {
            break;
        }
        lines += memchr::memchr_iter(b'\n', &buf[..got]).count() as u64;
        left -= got as u64;
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: Option<CsvQuoting> = Some(CsvQuoting {
        quote: b'"',
        delimiter: b',',
    });

    fn records(
        path: &Path,
        range: Range<u64>,
        first_line: u64,
        quote: Option<CsvQuoting>,
        max: usize,
    ) -> Vec<(u64, String)> {
        let mut r = RecordReader::open(File::open(path).expect("test"), range, first_line, quote)
            .expect("test")
            .with_buffer(max.min(4));
        let mut out = vec![];
        loop {
            let c = r.read(max, u64::MAX).expect("test");
            if c.records.is_empty() {
                return out;
            }
            for rec in &c.records {
                out.push((rec.number, String::from_utf8(c.bytes(rec).to_vec()).expect("test")));
            }
        }
    }

    fn whole_and_ranges(text: &str, quote: Option<CsvQuoting>) {
        let dir = tempfile::tempdir().expect("test");
        let path = dir.path().join("f");
        std::fs::write(&path, text).expect("test");
        let size = text.len() as u64;
        for max in [1, 2, 1000] {
            let whole = records(&path, 0..size, 0, quote, max);
            for n in 1..=7 {
                let starts = range_starts_with(&path, n, n, quote, max.min(5)).expect("test");
                let starts: Vec<(u64, u64)> = starts
                    .iter()
                    .map(|s| (*s, lines_before(&path, *s).expect("test")))
                    .collect();
                for need in 1..n {
                    let first = range_starts_with(&path, n, need, quote, 3).expect("test");
                    assert_eq!(first, starts[..need].iter().map(|s| s.0).collect::<Vec<_>>());
                }
                let mut parts = vec![];
                for i in 0..n {
                    let end = starts.get(i + 1).map_or(size, |s| s.0);
                    parts.extend(records(&path, starts[i].0..end, starts[i].1, quote, max));
                }
                assert_eq!(parts, whole, "{n} ranges, {max} records a read, of {text:?}");
            }
        }
    }

    #[test]
    fn ranges_read_every_record_once_with_its_line_number() {
        whole_and_ranges("a,1\nb,2\nc,3\n", CSV);
        // No trailing newline, CRLF, empty lines.
        whole_and_ranges("a,1\r\nb,2\r\n\r\nc,3", CSV);
        // Line breaks inside quotes, and doubled quotes.
        whole_and_ranges(
            "1,\"two\nlines\"\n2,\"x\"\"y\"\n3,\"a\n\nb\n\"\n4,z\n5,\"\"\"\nq\"\n",
            CSV,
        );
        // JSON lines: every line break is a boundary.
        whole_and_ranges("{\"a\":1}\n{\"a\":\"x,\\\"y\"}\n{\"a\":3}", None);
        whole_and_ranges("", CSV);
        // Quotes that are characters (not at a field's start), next to
        // quoted fields with line breaks.
        whole_and_ranges(
            "1,6\" pipe,x\n2,\"a \"\"b\"\" c\"\n3,x\"y\"z\n4,\"q\"\n5,a\"b,\"c\nd\"\n6,\"\"\n7,e\n",
            CSV,
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Any text of commas, quotes, line breaks and letters: the byte
        /// ranges read exactly the records of the whole file, with their
        /// line numbers.
        #[test]
        fn ranges_of_any_csv_text_read_the_whole_files_records(
            text in proptest::collection::vec(proptest::sample::select(vec![b'a', b',', b'"', b'\n', b'\r']), 0..60)
        ) {
            whole_and_ranges(&String::from_utf8(text).expect("ascii"), CSV);
        }
    }

    /// Records as csv_core splits them: a quote inside an unquoted field
    /// is a character and does not swallow the next line.
    #[test]
    fn quotes_inside_unquoted_fields_are_characters() {
        let dir = tempfile::tempdir().expect("test");
        let path = dir.path().join("f");
        let text = "1,6\" pipe\n2,\"a \"\"b\"\" c\"\n3,x\"y\"z\n4,\"l1\nl2\"\n5,a\"b,\"c\nd\"\n";
        std::fs::write(&path, text).expect("test");
        let got: Vec<String> = records(&path, 0..text.len() as u64, 0, CSV, 100)
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        let mut want = vec![];
        let mut reader = csv_core::Reader::new();
        let mut input = text.as_bytes();
        let (mut out, mut ends) = ([0u8; 256], [0usize; 16]);
        loop {
            let (res, n_in, _, _) = reader.read_record(input, &mut out, &mut ends);
            let consumed = &input[..n_in];
            input = &input[n_in..];
            match res {
                csv_core::ReadRecordResult::Record => {
                    want.push(String::from_utf8_lossy(consumed).trim_end_matches('\n').to_string())
                }
                csv_core::ReadRecordResult::End => break,
                _ => {}
            }
        }
        assert_eq!(got, want);
        assert_eq!(got.len(), 5);
    }

    #[test]
    fn a_quoted_line_break_continues_the_record() {
        let dir = tempfile::tempdir().expect("test");
        let path = dir.path().join("f");
        std::fs::write(&path, "1,\"a\nb\"\n2,c\n").expect("test");
        let got = records(&path, 0..12, 0, CSV, 10);
        assert_eq!(got, vec![(1, "1,\"a\nb\"".to_string()), (3, "2,c".to_string())]);
    }
}
