//! Weir's own byte encoding of rows: keys and values of persisted state.
//!
//! State outlives a build of Weir: a savepoint taken today must restore in
//! next year's release. Arrow's row format is documented as free to change
//! between releases, so it is never the persisted form. This encoding is
//! Weir's, versioned by [`FORMAT_VERSION`], and pinned by golden tests
//! (fixed bytes for fixed values of every type): a change that alters a
//! byte fails a test instead of every user's restore.
//!
//! Each value is a tag byte (`0` NULL, `1` present) and then:
//! - BOOLEAN: one byte, 0 or 1;
//! - integers, dates, times, timestamps, durations, decimals: the value's
//!   bytes big-endian, the sign bit flipped for signed types (byte order
//!   equals numeric order);
//! - floats: IEEE bits big-endian, transformed so byte order is the total
//!   order (`-NaN < -inf < ... < -0 < +0 < ... < +inf < NaN`);
//! - strings and binaries: length (u32 big-endian) and the bytes;
//! - lists: element count (u32 big-endian) and the elements;
//! - rows (structs): each field in order (nothing more when NULL);
//! - maps (and MULTISETs): entry count (u32 big-endian) and each entry as
//!   a row of key and value.
//!
//! Types are named by [`type_name`], also Weir's, for the same reason.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayData, ArrayRef, AsArray, BinaryArray, BinaryViewArray, BooleanArray, LargeBinaryArray, LargeListArray,
    LargeStringArray, ListArray, MapArray, StringArray, StringViewArray, StructArray, make_array,
};
use arrow::buffer::{Buffer, NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, FieldRef, Fields, TimeUnit};

use crate::error::StateError;

/// Version of the state encoding (keys here, and the keyed-state layer's
/// value framing); stored with every checkpoint and savepoint. 2: a
/// TTL-able state's value starts with a tag byte (write time only when
/// the job has a TTL), and a GROUP BY's DISTINCT value counts are shared
/// per argument.
pub const FORMAT_VERSION: u32 = 2;

/// Rows kept together in one state value (a Top-N partition, a window
/// partition's rows, the rows of a time, a session's rows, a join key's
/// rows of a window or a time): each row's bytes behind their length as a
/// big-endian u32. The on-disk format of seven operators' values; the
/// golden bytes in this file's tests hold it.
pub struct RowList;

impl RowList {
    /// The value holding `rows`, in order.
    pub fn encode<'a>(rows: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
        let mut b = vec![];
        for r in rows {
            Self::append(&mut b, r);
        }
        b
    }

    /// `row` added at the end of the value `out`.
    pub fn append(out: &mut Vec<u8>, row: &[u8]) {
        out.extend_from_slice(&(row.len() as u32).to_be_bytes());
        out.extend_from_slice(row);
    }

    /// The rows of a value; `None` if it is cut short (the caller says
    /// whose state and key).
    pub fn decode(bytes: &[u8]) -> Option<Vec<&[u8]>> {
        let mut rows = vec![];
        let mut at = 0;
        while at < bytes.len() {
            let len = u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
            rows.push(bytes.get(at + 4..(at + 4).checked_add(len)?)?);
            at += 4 + len;
        }
        Some(rows)
    }
}

/// Counts as stored in state values (a GROUP BY's value counts, a join's
/// row multiplicities): each a zigzag LEB128 varint. A count is almost
/// always small (one byte, where a fixed i64 took eight), and may go
/// negative when a retraction comes before its row.
pub fn encode_counts(counts: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(counts.len());
    append_counts(&mut out, counts);
    out
}

/// The length of [`encode_counts`]' bytes for `counts`.
pub fn counts_len(counts: &[i64]) -> usize {
    let zigzag = |c: i64| ((c << 1) ^ (c >> 63)) as u64;
    counts
        .iter()
        .map(|&c| (64 - zigzag(c).leading_zeros() as usize).div_ceil(7).max(1))
        .sum()
}

/// [`encode_counts`] onto the end of `out`.
pub fn append_counts(out: &mut Vec<u8>, counts: &[i64]) {
    for &c in counts {
        let mut z = ((c << 1) ^ (c >> 63)) as u64;
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
    }
}

/// Fills `out` from [`encode_counts`]' bytes; `None` unless `v` holds
/// exactly `out.len()` counts.
pub fn decode_counts(v: &[u8], out: &mut [i64]) -> Option<()> {
    (decode_counts_prefix(v, out)? == v.len()).then_some(())
}

/// Fills `out` from the [`encode_counts`] bytes `v` starts with and
/// returns how many bytes they took (what follows is the caller's).
pub fn decode_counts_prefix(v: &[u8], out: &mut [i64]) -> Option<usize> {
    let mut at = 0;
    for c in out.iter_mut() {
        let mut z: u64 = 0;
        let mut shift = 0;
        loop {
            let b = *v.get(at)?;
            at += 1;
            if shift > 63 {
                return None;
            }
            z |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        *c = ((z >> 1) as i64) ^ -((z & 1) as i64);
    }
    Some(at)
}

/// Limit on nested lists: state types come from plans, not from files, but
/// a corrupt file must not recurse without end either.
const MAX_DEPTH: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Signed,
    Unsigned,
    Float,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bytes {
    Utf8,
    LargeUtf8,
    Utf8View,
    Binary,
    LargeBinary,
    BinaryView,
}

/// How one column is encoded.
#[derive(Debug, Clone)]
enum Kind {
    Bool,
    Fixed {
        width: usize,
        num: Num,
    },
    Bytes(Bytes),
    List {
        large: bool,
        field: FieldRef,
        item: Box<Kind>,
    },
    Struct {
        fields: Fields,
        children: Vec<Kind>,
    },
    Map {
        entries: FieldRef,
        sorted: bool,
        entry: Box<Kind>,
    },
}

fn kind_of(dt: &DataType, depth: usize) -> Option<Kind> {
    use DataType::*;
    let fixed = |width, num| Some(Kind::Fixed { width, num });
    match dt {
        Boolean => Some(Kind::Bool),
        Int8 => fixed(1, Num::Signed),
        Int16 => fixed(2, Num::Signed),
        Int32 | Date32 | Time32(_) => fixed(4, Num::Signed),
        Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => fixed(8, Num::Signed),
        Decimal128(_, _) => fixed(16, Num::Signed),
        Decimal256(_, _) => fixed(32, Num::Signed),
        UInt8 => fixed(1, Num::Unsigned),
        UInt16 => fixed(2, Num::Unsigned),
        UInt32 => fixed(4, Num::Unsigned),
        UInt64 => fixed(8, Num::Unsigned),
        Float32 => fixed(4, Num::Float),
        Float64 => fixed(8, Num::Float),
        Utf8 => Some(Kind::Bytes(Bytes::Utf8)),
        LargeUtf8 => Some(Kind::Bytes(Bytes::LargeUtf8)),
        Utf8View => Some(Kind::Bytes(Bytes::Utf8View)),
        Binary => Some(Kind::Bytes(Bytes::Binary)),
        LargeBinary => Some(Kind::Bytes(Bytes::LargeBinary)),
        BinaryView => Some(Kind::Bytes(Bytes::BinaryView)),
        List(f) | LargeList(f) if depth < MAX_DEPTH => Some(Kind::List {
            large: matches!(dt, LargeList(_)),
            field: f.clone(),
            item: Box::new(kind_of(f.data_type(), depth + 1)?),
        }),
        Struct(fields) if depth < MAX_DEPTH => Some(Kind::Struct {
            fields: fields.clone(),
            children: fields
                .iter()
                .map(|f| kind_of(f.data_type(), depth + 1))
                .collect::<Option<Vec<_>>>()?,
        }),
        Map(entries, sorted) if depth < MAX_DEPTH => Some(Kind::Map {
            entries: entries.clone(),
            sorted: *sorted,
            entry: Box::new(kind_of(entries.data_type(), depth + 1)?),
        }),
        _ => None,
    }
}

/// Weir's stable name of a type (plan fingerprints, state compatibility).
pub fn type_name(dt: &DataType) -> String {
    use DataType::*;
    let unit = |u: &TimeUnit| match u {
        TimeUnit::Second => "s",
        TimeUnit::Millisecond => "ms",
        TimeUnit::Microsecond => "us",
        TimeUnit::Nanosecond => "ns",
    };
    match dt {
        Boolean => "boolean".into(),
        Int8 => "i8".into(),
        Int16 => "i16".into(),
        Int32 => "i32".into(),
        Int64 => "i64".into(),
        UInt8 => "u8".into(),
        UInt16 => "u16".into(),
        UInt32 => "u32".into(),
        UInt64 => "u64".into(),
        Float32 => "f32".into(),
        Float64 => "f64".into(),
        Date32 => "date32".into(),
        Date64 => "date64".into(),
        Time32(u) => format!("time32[{}]", unit(u)),
        Time64(u) => format!("time64[{}]", unit(u)),
        Timestamp(u, tz) => match tz {
            Some(tz) => format!("timestamp[{},{tz}]", unit(u)),
            None => format!("timestamp[{}]", unit(u)),
        },
        Duration(u) => format!("duration[{}]", unit(u)),
        Decimal128(p, s) => format!("decimal128({p},{s})"),
        Decimal256(p, s) => format!("decimal256({p},{s})"),
        Utf8 | LargeUtf8 | Utf8View => "string".into(),
        Binary | LargeBinary | BinaryView => "binary".into(),
        List(f) | LargeList(f) => format!("list<{}>", type_name(f.data_type())),
        Struct(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .map(|f| format!("{}:{}", f.name(), type_name(f.data_type())))
                .collect();
            format!("struct<{}>", fields.join(","))
        }
        Map(entries, _) => match entries.data_type() {
            Struct(kv) if kv.len() == 2 => {
                let kind = if entries.name() == crate::multiset::ENTRIES {
                    "multiset"
                } else {
                    "map"
                };
                format!(
                    "{kind}<{},{}>",
                    type_name(kv[0].data_type()),
                    type_name(kv[1].data_type())
                )
            }
            other => format!("unsupported:{other}"),
        },
        Null => "null".into(),
        other => format!("unsupported:{other}"),
    }
}

/// Encodes and decodes rows of fixed column types.
#[derive(Debug, Clone)]
pub struct RowCodec {
    types: Vec<DataType>,
    kinds: Vec<Kind>,
}

/// Encoded rows in one buffer.
#[derive(Debug, Default)]
pub struct Rows {
    data: Vec<u8>,
    offsets: Vec<usize>,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn row(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i]..self.offsets[i + 1]]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.row(i))
    }
}

/// Error for a type the encoding does not cover.
pub fn unsupported(dt: &DataType) -> String {
    format!("values of type {dt} cannot be kept in state yet")
}

impl RowCodec {
    /// `None`'s error names the first type the encoding does not cover.
    pub fn new(types: &[DataType]) -> Result<Self, String> {
        let kinds = types
            .iter()
            .map(|t| kind_of(t, 0).ok_or_else(|| unsupported(t)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            types: types.to_vec(),
            kinds,
        })
    }

    pub fn types(&self) -> &[DataType] {
        &self.types
    }

    /// Encodes every row of `columns` (one per type, equal lengths).
    pub fn encode(&self, columns: &[ArrayRef]) -> Result<Rows, StateError> {
        if columns.len() != self.kinds.len() {
            return Err(internal(format!(
                "{} columns given to a codec of {}",
                columns.len(),
                self.kinds.len()
            )));
        }
        let n = columns.first().map_or(0, |c| c.len());
        let cols = columns
            .iter()
            .zip(&self.kinds)
            .map(|(c, k)| Col::new(c.as_ref(), k))
            .collect::<Result<Vec<_>, _>>()?;
        let mut rows = Rows {
            data: Vec::with_capacity(n * 16),
            offsets: Vec::with_capacity(n + 1),
        };
        rows.offsets.push(0);
        for i in 0..n {
            for c in &cols {
                c.encode(i, &mut rows.data);
            }
            rows.offsets.push(rows.data.len());
        }
        Ok(rows)
    }

    /// Decodes rows made by [`RowCodec::encode`] with the same types.
    pub fn decode<'a>(&self, rows: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>, StateError> {
        let mut builders: Vec<Builder> = self.kinds.iter().map(Builder::new).collect();
        for (r, row) in rows.into_iter().enumerate() {
            let mut cur = Cursor { bytes: row, pos: 0 };
            for b in builders.iter_mut() {
                b.read(&mut cur).map_err(|m| corrupt(format!("row {r}: {m}")))?;
            }
            if cur.pos != row.len() {
                return Err(corrupt(format!("row {r}: {} trailing bytes", row.len() - cur.pos)));
            }
        }
        builders
            .into_iter()
            .zip(&self.types)
            .map(|(b, t)| b.finish(t))
            .collect()
    }
}

fn internal(message: String) -> StateError {
    StateError::Corrupt {
        state: "row codec".into(),
        message,
    }
}

fn corrupt(message: String) -> StateError {
    StateError::Corrupt {
        state: "encoded row".into(),
        message,
    }
}

/// A column prepared for encoding.
struct Col<'a> {
    nulls: Option<NullBuffer>,
    body: Body<'a>,
}

enum Body<'a> {
    Bool(&'a BooleanArray),
    Fixed { buf: Buffer, width: usize, num: Num },
    Bytes(&'a dyn Array, Bytes),
    List { offsets: Vec<usize>, item: Box<Col<'a>> },
    Struct(Vec<Col<'a>>),
}

impl<'a> Col<'a> {
    fn new(a: &'a dyn Array, kind: &Kind) -> Result<Self, StateError> {
        let nulls = a.logical_nulls();
        let body = match kind {
            Kind::Bool => Body::Bool(a.as_boolean_opt().ok_or_else(|| mismatch(a))?),
            Kind::Fixed { width, num } => {
                let data = a.to_data();
                let buf = data.buffers().first().ok_or_else(|| mismatch(a))?;
                let start = data.offset() * width;
                let len = data.len() * width;
                if buf.len() < start + len {
                    return Err(mismatch(a));
                }
                Body::Fixed {
                    buf: buf.slice_with_length(start, len),
                    width: *width,
                    num: *num,
                }
            }
            Kind::Bytes(b) => Body::Bytes(a, *b),
            Kind::List { large, item, .. } => {
                let (offsets, values): (Vec<usize>, &ArrayRef) = if *large {
                    let l = a.as_list_opt::<i64>().ok_or_else(|| mismatch(a))?;
                    (l.value_offsets().iter().map(|o| *o as usize).collect(), l.values())
                } else {
                    let l = a.as_list_opt::<i32>().ok_or_else(|| mismatch(a))?;
                    (l.value_offsets().iter().map(|o| *o as usize).collect(), l.values())
                };
                Body::List {
                    offsets,
                    item: Box::new(Col::new(values.as_ref(), item)?),
                }
            }
            Kind::Struct { children, .. } => {
                let row = a.as_struct_opt().ok_or_else(|| mismatch(a))?;
                Body::Struct(
                    row.columns()
                        .iter()
                        .zip(children)
                        .map(|(c, k)| Col::new(c.as_ref(), k))
                        .collect::<Result<_, _>>()?,
                )
            }
            Kind::Map { entry, .. } => {
                let m = a.as_map_opt().ok_or_else(|| mismatch(a))?;
                Body::List {
                    offsets: m.value_offsets().iter().map(|o| *o as usize).collect(),
                    item: Box::new(Col::new(m.entries(), entry)?),
                }
            }
        };
        Ok(Self { nulls, body })
    }

    fn encode(&self, i: usize, out: &mut Vec<u8>) {
        if self.nulls.as_ref().is_some_and(|n| n.is_null(i)) {
            out.push(0);
            return;
        }
        out.push(1);
        match &self.body {
            Body::Bool(a) => out.push(u8::from(a.value(i))),
            Body::Fixed { buf, width, num } => {
                let le = &buf.as_slice()[i * width..(i + 1) * width];
                let at = out.len();
                out.extend(le.iter().rev());
                let be = &mut out[at..];
                match num {
                    Num::Signed => be[0] ^= 0x80,
                    Num::Unsigned => {}
                    Num::Float => {
                        if be[0] & 0x80 != 0 {
                            be.iter_mut().for_each(|b| *b = !*b);
                        } else {
                            be[0] ^= 0x80;
                        }
                    }
                }
            }
            Body::Bytes(a, kind) => {
                let v: &[u8] = match kind {
                    Bytes::Utf8 => a.as_string::<i32>().value(i).as_bytes(),
                    Bytes::LargeUtf8 => a.as_string::<i64>().value(i).as_bytes(),
                    Bytes::Utf8View => a.as_string_view().value(i).as_bytes(),
                    Bytes::Binary => a.as_binary::<i32>().value(i),
                    Bytes::LargeBinary => a.as_binary::<i64>().value(i),
                    Bytes::BinaryView => a.as_binary_view().value(i),
                };
                out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                out.extend_from_slice(v);
            }
            Body::List { offsets, item } => {
                let (s, e) = (offsets[i], offsets[i + 1]);
                out.extend_from_slice(&((e - s) as u32).to_be_bytes());
                for j in s..e {
                    item.encode(j, out);
                }
            }
            Body::Struct(children) => {
                for c in children {
                    c.encode(i, out);
                }
            }
        }
    }
}

fn mismatch(a: &dyn Array) -> StateError {
    internal(format!("column of type {} does not match the codec", a.data_type()))
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated at byte {} of {}", self.pos, self.bytes.len()))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn len(&mut self) -> Result<usize, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
}

/// A column being decoded.
enum Builder {
    Bool {
        values: Vec<bool>,
        valid: Vec<bool>,
    },
    Fixed {
        bytes: Vec<u8>,
        valid: Vec<bool>,
        width: usize,
        num: Num,
    },
    Bytes {
        values: Vec<u8>,
        offsets: Vec<usize>,
        valid: Vec<bool>,
    },
    List {
        offsets: Vec<usize>,
        valid: Vec<bool>,
        field: FieldRef,
        item: Box<Builder>,
    },
    Struct {
        valid: Vec<bool>,
        fields: Fields,
        children: Vec<Builder>,
    },
    Map {
        offsets: Vec<usize>,
        valid: Vec<bool>,
        entries: FieldRef,
        sorted: bool,
        entry: Box<Builder>,
    },
}

impl Builder {
    fn new(kind: &Kind) -> Self {
        match kind {
            Kind::Bool => Builder::Bool {
                values: vec![],
                valid: vec![],
            },
            Kind::Fixed { width, num } => Builder::Fixed {
                bytes: vec![],
                valid: vec![],
                width: *width,
                num: *num,
            },
            Kind::Bytes(_) => Builder::Bytes {
                values: vec![],
                offsets: vec![0],
                valid: vec![],
            },
            Kind::List { field, item, .. } => Builder::List {
                offsets: vec![0],
                valid: vec![],
                field: field.clone(),
                item: Box::new(Builder::new(item)),
            },
            Kind::Struct { fields, children } => Builder::Struct {
                valid: vec![],
                fields: fields.clone(),
                children: children.iter().map(Builder::new).collect(),
            },
            Kind::Map { entries, sorted, entry } => Builder::Map {
                offsets: vec![0],
                valid: vec![],
                entries: entries.clone(),
                sorted: *sorted,
                entry: Box::new(Builder::new(entry)),
            },
        }
    }

    /// A NULL row (the fields of a NULL struct: every column of a struct
    /// array has a row for it).
    fn push_null(&mut self) {
        match self {
            Builder::Bool { values, valid } => {
                valid.push(false);
                values.push(false);
            }
            Builder::Fixed {
                bytes, valid, width, ..
            } => {
                valid.push(false);
                bytes.extend(std::iter::repeat_n(0, *width));
            }
            Builder::Bytes { values, offsets, valid } => {
                valid.push(false);
                offsets.push(values.len());
            }
            Builder::List { offsets, valid, .. } | Builder::Map { offsets, valid, .. } => {
                valid.push(false);
                offsets.push(offsets.last().copied().unwrap_or(0));
            }
            Builder::Struct { valid, children, .. } => {
                valid.push(false);
                children.iter_mut().for_each(Builder::push_null);
            }
        }
    }

    fn read(&mut self, cur: &mut Cursor) -> Result<(), String> {
        let tag = cur.take(1)?[0];
        let present = match tag {
            0 => false,
            1 => true,
            t => return Err(format!("bad null tag {t} at byte {}", cur.pos - 1)),
        };
        match self {
            Builder::Bool { values, valid } => {
                valid.push(present);
                values.push(present && cur.take(1)?[0] != 0);
            }
            Builder::Fixed {
                bytes,
                valid,
                width,
                num,
            } => {
                valid.push(present);
                if !present {
                    bytes.extend(std::iter::repeat_n(0, *width));
                    return Ok(());
                }
                let mut be = cur.take(*width)?.to_vec();
                match num {
                    Num::Signed => be[0] ^= 0x80,
                    Num::Unsigned => {}
                    Num::Float => {
                        if be[0] & 0x80 != 0 {
                            be[0] ^= 0x80;
                        } else {
                            be.iter_mut().for_each(|b| *b = !*b);
                        }
                    }
                }
                bytes.extend(be.iter().rev());
            }
            Builder::Bytes { values, offsets, valid } => {
                valid.push(present);
                if present {
                    let n = cur.len()?;
                    values.extend_from_slice(cur.take(n)?);
                }
                offsets.push(values.len());
            }
            Builder::Struct { valid, children, .. } => {
                valid.push(present);
                for c in children.iter_mut() {
                    if present { c.read(cur)? } else { c.push_null() }
                }
            }
            Builder::List {
                offsets, valid, item, ..
            }
            | Builder::Map {
                offsets,
                valid,
                entry: item,
                ..
            } => {
                valid.push(present);
                let mut count = 0;
                if present {
                    count = cur.len()?;
                    if count > cur.bytes.len() {
                        return Err(format!(
                            "list of {count} elements in a row of {} bytes",
                            cur.bytes.len()
                        ));
                    }
                    for _ in 0..count {
                        item.read(cur)?;
                    }
                }
                let last = offsets.last().copied().unwrap_or(0);
                offsets.push(last + count);
            }
        }
        Ok(())
    }

    fn finish(self, dt: &DataType) -> Result<ArrayRef, StateError> {
        let nulls = |valid: Vec<bool>| {
            let n = NullBuffer::from(valid);
            (n.null_count() > 0).then_some(n)
        };
        let arrow = |e: arrow::error::ArrowError| corrupt(e.to_string());
        Ok(match self {
            Builder::Bool { values, valid } => Arc::new(BooleanArray::new(values.into(), nulls(valid))),
            Builder::Fixed { bytes, valid, .. } => {
                let len = valid.len();
                // An empty Vec's pointer is dangling (address 1): arrow
                // would refuse it as misaligned for wider types.
                let buffer = if bytes.is_empty() {
                    Buffer::from(arrow::buffer::MutableBuffer::new(0))
                } else {
                    Buffer::from_vec(bytes)
                };
                let data = ArrayData::builder(dt.clone())
                    .len(len)
                    .add_buffer(buffer)
                    .nulls(nulls(valid))
                    .build()
                    .map_err(arrow)?;
                make_array(data)
            }
            Builder::Bytes { values, offsets, valid } => {
                let nulls = nulls(valid);
                let values = Buffer::from_vec(values);
                let offsets32 = || -> Result<OffsetBuffer<i32>, StateError> {
                    let o: Vec<i32> = offsets
                        .iter()
                        .map(|o| i32::try_from(*o).map_err(|_| corrupt("value over 2 GiB".into())))
                        .collect::<Result<_, _>>()?;
                    Ok(OffsetBuffer::new(o.into()))
                };
                let offsets64 = || OffsetBuffer::new(offsets.iter().map(|o| *o as i64).collect::<Vec<_>>().into());
                match dt {
                    DataType::Utf8 => Arc::new(StringArray::try_new(offsets32()?, values, nulls).map_err(arrow)?),
                    DataType::LargeUtf8 => {
                        Arc::new(LargeStringArray::try_new(offsets64(), values, nulls).map_err(arrow)?)
                    }
                    DataType::Utf8View => {
                        let s = StringArray::try_new(offsets32()?, values, nulls).map_err(arrow)?;
                        Arc::new(StringViewArray::from_iter(s.iter()))
                    }
                    DataType::Binary => Arc::new(BinaryArray::try_new(offsets32()?, values, nulls).map_err(arrow)?),
                    DataType::LargeBinary => {
                        Arc::new(LargeBinaryArray::try_new(offsets64(), values, nulls).map_err(arrow)?)
                    }
                    _ => {
                        let b = BinaryArray::try_new(offsets32()?, values, nulls).map_err(arrow)?;
                        Arc::new(BinaryViewArray::from_iter(b.iter()))
                    }
                }
            }
            Builder::List {
                offsets,
                valid,
                field,
                item,
            } => {
                let values = item.finish(field.data_type())?;
                let nulls = nulls(valid);
                match dt {
                    DataType::LargeList(_) => {
                        let o = OffsetBuffer::new(offsets.iter().map(|o| *o as i64).collect::<Vec<_>>().into());
                        Arc::new(LargeListArray::try_new(field, o, values, nulls).map_err(arrow)?)
                    }
                    _ => {
                        let o: Vec<i32> = offsets
                            .iter()
                            .map(|o| i32::try_from(*o).map_err(|_| corrupt("list over 2^31 elements".into())))
                            .collect::<Result<_, _>>()?;
                        Arc::new(ListArray::try_new(field, OffsetBuffer::new(o.into()), values, nulls).map_err(arrow)?)
                    }
                }
            }
            Builder::Struct {
                valid,
                fields,
                children,
            } => {
                let columns = children
                    .into_iter()
                    .zip(fields.iter())
                    .map(|(c, f)| c.finish(f.data_type()))
                    .collect::<Result<Vec<_>, _>>()?;
                if columns.is_empty() {
                    Arc::new(StructArray::new_empty_fields(valid.len(), nulls(valid)))
                } else {
                    Arc::new(StructArray::try_new(fields, columns, nulls(valid)).map_err(arrow)?)
                }
            }
            Builder::Map {
                offsets,
                valid,
                entries,
                sorted,
                entry,
            } => {
                let values = entry.finish(entries.data_type())?;
                let values = values
                    .as_struct_opt()
                    .ok_or_else(|| corrupt("map entries are not rows".into()))?
                    .clone();
                let o: Vec<i32> = offsets
                    .iter()
                    .map(|o| i32::try_from(*o).map_err(|_| corrupt("map over 2^31 entries".into())))
                    .collect::<Result<_, _>>()?;
                Arc::new(
                    MapArray::try_new(entries, OffsetBuffer::new(o.into()), values, nulls(valid), sorted)
                        .map_err(arrow)?,
                )
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_len_is_the_encoded_length() {
        for c in [0i64, 1, -1, 63, 64, -64, -65, 8191, 8192, i64::MAX, i64::MIN] {
            assert_eq!(counts_len(&[c, 5]), encode_counts(&[c, 5]).len(), "{c}");
        }
    }

    #[test]
    fn row_lists_keep_their_golden_bytes() {
        let rows: [&[u8]; 3] = [b"ab", b"", b"xyz"];
        let bytes = RowList::encode(rows.iter().copied());
        // Recorded: the format savepoints hold (each length a big-endian u32).
        assert_eq!(
            bytes,
            [0, 0, 0, 2, b'a', b'b', 0, 0, 0, 0, 0, 0, 0, 3, b'x', b'y', b'z']
        );
        assert_eq!(RowList::decode(&bytes), Some(rows.to_vec()));
        assert_eq!(RowList::decode(&[]), Some(vec![]));
        // Cut in a length, cut in a row, a length past the end.
        assert_eq!(RowList::decode(&bytes[..2]), None);
        assert_eq!(RowList::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(RowList::decode(&[0xff, 0xff, 0xff, 0xff, 1]), None);
        let mut appended = RowList::encode(rows[..2].iter().copied());
        RowList::append(&mut appended, b"xyz");
        assert_eq!(appended, bytes);
    }

    #[test]
    fn counts_round_trip_as_varints_and_bad_bytes_are_refused() {
        let counts = [0, 1, -1, 63, -64, 64, 300, i64::MAX, i64::MIN];
        let bytes = encode_counts(&counts);
        assert_eq!(encode_counts(&[1, 1, 0, 2]), [2, 2, 0, 4], "small counts: a byte each");
        let mut back = [0; 9];
        assert_eq!(decode_counts(&bytes, &mut back), Some(()));
        assert_eq!(back, counts);
        // Too few bytes, too many, an endless varint.
        assert_eq!(decode_counts(&bytes[..bytes.len() - 1], &mut back), None);
        let mut more = bytes.clone();
        more.push(0);
        assert_eq!(decode_counts(&more, &mut back), None);
        assert_eq!(decode_counts(&[0xff; 11], &mut [0]), None);
        assert_eq!(decode_counts(&[], &mut [0]), None);
    }
    use arrow::array::*;
    use arrow::datatypes::{Field, Int64Type, i256};

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Encodes one column; returns every row's bytes in hex.
    fn golden(col: ArrayRef) -> Vec<String> {
        let codec = RowCodec::new(&[col.data_type().clone()]).expect("codec");
        let rows = codec.encode(std::slice::from_ref(&col)).expect("encode");
        let back = codec.decode(rows.iter()).expect("decode");
        assert_eq!(back[0].as_ref(), col.as_ref(), "round trip of {}", col.data_type());
        rows.iter().map(hex).collect()
    }

    /// Fixed bytes for fixed values: persisted state depends on them.
    #[test]
    fn golden_encodings_of_every_key_type() {
        assert_eq!(
            golden(Arc::new(BooleanArray::from(vec![Some(true), Some(false), None]))),
            ["0101", "0100", "00"]
        );
        assert_eq!(
            golden(Arc::new(Int8Array::from(vec![Some(-1), Some(5), None]))),
            ["017f", "0185", "00"]
        );
        assert_eq!(golden(Arc::new(Int16Array::from(vec![-2, 300]))), ["017ffe", "01812c"]);
        assert_eq!(
            golden(Arc::new(Int32Array::from(vec![-1, 0, 7]))),
            ["017fffffff", "0180000000", "0180000007"]
        );
        assert_eq!(
            golden(Arc::new(Int64Array::from(vec![i64::MIN, 1000]))),
            ["010000000000000000", "0180000000000003e8"]
        );
        assert_eq!(golden(Arc::new(UInt8Array::from(vec![200]))), ["01c8"]);
        assert_eq!(golden(Arc::new(UInt16Array::from(vec![258]))), ["010102"]);
        assert_eq!(golden(Arc::new(UInt32Array::from(vec![1]))), ["0100000001"]);
        assert_eq!(
            golden(Arc::new(UInt64Array::from(vec![u64::MAX]))),
            ["01ffffffffffffffff"]
        );
        assert_eq!(
            golden(Arc::new(Float32Array::from(vec![1.5, -1.5]))),
            ["01bfc00000", "01403fffff"]
        );
        assert_eq!(
            golden(Arc::new(Float64Array::from(vec![0.0, -0.0, 2.0]))),
            ["018000000000000000", "017fffffffffffffff", "01c000000000000000"]
        );
        assert_eq!(golden(Arc::new(Date32Array::from(vec![19000]))), ["0180004a38"]);
        assert_eq!(
            golden(Arc::new(TimestampMillisecondArray::from(vec![1_700_000_000_000]))),
            ["018000018bcfe56800"]
        );
        assert_eq!(
            golden(Arc::new(TimestampMicrosecondArray::from(vec![-1]).with_timezone("UTC"))),
            ["017fffffffffffffff"]
        );
        assert_eq!(
            golden(Arc::new(
                Decimal128Array::from(vec![Some(-12345), None])
                    .with_precision_and_scale(10, 2)
                    .expect("decimal")
            )),
            ["017fffffffffffffffffffffffffffcfc7", "00"]
        );
        assert_eq!(
            golden(Arc::new(
                Decimal256Array::from(vec![i256::from_i128(1)])
                    .with_precision_and_scale(40, 0)
                    .expect("decimal")
            )),
            ["018000000000000000000000000000000000000000000000000000000000000001"]
        );
        for strings in [
            Arc::new(StringArray::from(vec![Some("héllo"), Some(""), None])) as ArrayRef,
            Arc::new(LargeStringArray::from(vec![Some("héllo"), Some(""), None])),
            Arc::new(StringViewArray::from(vec![Some("héllo"), Some(""), None])),
        ] {
            assert_eq!(golden(strings), ["010000000668c3a96c6c6f", "0100000000", "00"]);
        }
        for binaries in [
            Arc::new(BinaryArray::from(vec![Some(&b"\x00\xff"[..]), None])) as ArrayRef,
            Arc::new(LargeBinaryArray::from(vec![Some(&b"\x00\xff"[..]), None])),
            Arc::new(BinaryViewArray::from(vec![Some(&b"\x00\xff"[..]), None])),
        ] {
            assert_eq!(golden(binaries), ["010000000200ff", "00"]);
        }
        let list =
            ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), None]), None, Some(vec![])]);
        assert_eq!(
            golden(Arc::new(list)),
            [
                "0100000002018000000000000001".to_string() + "00",
                "00".to_string(),
                "0100000000".to_string()
            ]
        );
    }

    #[test]
    fn golden_encodings_of_rows_and_maps() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, None]));
        let b: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), None, Some("")]));
        let fields = Fields::from(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ]);
        let rows =
            StructArray::try_new(fields, vec![a, b], Some(NullBuffer::from(vec![true, false, true]))).expect("struct");
        assert_eq!(
            golden(Arc::new(rows.clone())),
            [
                "0101800000010100000001".to_string() + "78",
                "00".into(),
                "01000100000000".into()
            ]
        );
        assert_eq!(golden(Arc::new(rows.slice(1, 2))), ["00", "01000100000000"]);

        let mut m = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
        m.keys().append_value("a");
        m.values().append_value(1);
        m.append(true).expect("entry");
        m.append(false).expect("null");
        m.append(true).expect("empty");
        m.keys().append_value("b");
        m.values().append_null();
        m.append(true).expect("entry");
        let m = m.finish();
        assert_eq!(
            golden(Arc::new(m.clone())),
            [
                "0100000001".to_string() + "01" + "010000000161" + "0180000001",
                "00".into(),
                "0100000000".into(),
                "0100000001".to_string() + "01" + "010000000162" + "00",
            ]
        );
        assert_eq!(golden(Arc::new(m.slice(2, 2))).len(), 2);
        let multiset = crate::multiset::data_type(DataType::Utf8);
        assert_eq!(type_name(&multiset), "multiset<string,i32>");
        assert_eq!(type_name(m.data_type()), "map<string,i32>");
        assert_eq!(type_name(rows.data_type()), "struct<a:i32,b:string>");
    }

    #[test]
    fn multi_column_rows_and_slices() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]).slice(1, 2));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["x", "yy", "zzz"]).slice(1, 2));
        let codec = RowCodec::new(&[DataType::Int64, DataType::Utf8]).expect("codec");
        let rows = codec.encode(&[a.clone(), b.clone()]).expect("encode");
        assert_eq!(hex(rows.row(0)), "018000000000000002010000000279 79".replace(' ', ""));
        let back = codec.decode(rows.iter()).expect("decode");
        assert_eq!(back[0].as_ref(), a.as_ref());
        assert_eq!(back[1].as_ref(), b.as_ref());
    }

    #[test]
    fn order_of_bytes_is_order_of_numbers() {
        let v = vec![f64::NEG_INFINITY, -2.5, -0.0, 0.0, 1e-300, 3.0, f64::INFINITY];
        let codec = RowCodec::new(&[DataType::Float64]).expect("codec");
        let rows = codec
            .encode(&[Arc::new(Float64Array::from(v)) as ArrayRef])
            .expect("encode");
        let r: Vec<&[u8]> = rows.iter().collect();
        assert!(r.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn corrupt_rows_are_errors_not_panics() {
        let codec = RowCodec::new(&[
            DataType::Utf8,
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
        ])
        .expect("codec");
        for bad in [
            &b""[..],
            b"\x02",
            b"\x01\xff\xff\xff\xff",
            b"\x00\x01\x7f\xff\xff\xff",
            b"\x00\x00\x00",
        ] {
            assert!(codec.decode([bad]).is_err(), "{bad:?} accepted");
        }
        assert!(RowCodec::new(&[DataType::Interval(arrow::datatypes::IntervalUnit::DayTime)]).is_err());
    }

    #[test]
    fn type_names_are_weirs() {
        assert_eq!(
            type_name(&DataType::Timestamp(TimeUnit::Millisecond, None)),
            "timestamp[ms]"
        );
        assert_eq!(type_name(&DataType::Utf8View), "string");
        assert_eq!(
            type_name(&DataType::List(Arc::new(Field::new("x", DataType::Int32, true)))),
            "list<i32>"
        );
    }
}
