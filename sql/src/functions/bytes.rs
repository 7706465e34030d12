//! Flink's functions of `BYTES`: `TO_BASE64` (of a string's UTF-8 or of
//! bytes as they are), `UNHEX`, `ENCODE` and `DECODE` with Java's
//! charsets. Bytes are not text: they are read as bytes here, where the
//! string functions of `flink_scalars` read UTF-8 text (bytes that are
//! not UTF-8 would fail there).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, StringBuilder};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use base64::Engine;
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

/// The internal function the SHA functions are planned with: a digest's
/// bytes as lower-case hex (Flink's `SHA256(s)` text).
pub use crate::functions::names::HEX_OF_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    ToBase64,
    Unhex,
    Encode,
    Decode,
    HexOf,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct BytesFn {
    op: Op,
    signature: Signature,
}

/// The functions, to register.
pub fn all() -> Vec<ScalarUDF> {
    [Op::ToBase64, Op::Unhex, Op::Encode, Op::Decode, Op::HexOf]
        .into_iter()
        .map(|op| {
            ScalarUDF::new_from_impl(BytesFn {
                op,
                signature: Signature::variadic_any(Volatility::Immutable),
            })
        })
        .collect()
}

impl BytesFn {
    fn flink_name(&self) -> &'static str {
        match self.op {
            Op::ToBase64 => "TO_BASE64",
            Op::Unhex => "UNHEX",
            Op::Encode => "ENCODE",
            Op::Decode => "DECODE",
            Op::HexOf => "HEX",
        }
    }
}

fn is_text(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
    )
}

fn is_bytes(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_)
    )
}

/// Each value of `a` (a string or bytes column) as bytes.
fn byte_values(a: &ArrayRef) -> Result<Vec<Option<Vec<u8>>>> {
    let a = if is_text(a.data_type()) {
        cast(a, &DataType::Utf8)?
    } else {
        cast(a, &DataType::Binary)?
    };
    Ok(match a.data_type() {
        DataType::Utf8 => a
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(|s| s.as_bytes().to_vec()))
            .collect(),
        _ => a.as_binary::<i32>().iter().map(|v| v.map(<[u8]>::to_vec)).collect(),
    })
}

/// Java's encoder of `charset` (its standard charsets, named as Java
/// accepts them).
fn encode(text: &str, charset: &str) -> Result<Vec<u8>> {
    let latin = |limit: u32| -> Vec<u8> {
        text.chars()
            .map(|c| if (c as u32) < limit { c as u32 as u8 } else { b'?' })
            .collect()
    };
    let utf16 = |big: bool, bom: bool| -> Vec<u8> {
        let mut out = if bom { vec![0xFE, 0xFF] } else { vec![] };
        for unit in text.encode_utf16() {
            out.extend_from_slice(&if big { unit.to_be_bytes() } else { unit.to_le_bytes() });
        }
        out
    };
    Ok(match canonical(charset)? {
        "US-ASCII" => latin(0x80),
        "ISO-8859-1" => latin(0x100),
        "UTF-8" => text.as_bytes().to_vec(),
        "UTF-16BE" => utf16(true, false),
        "UTF-16LE" => utf16(false, false),
        _ => utf16(true, !text.is_empty()),
    })
}

/// Java's decoder of `charset`: malformed input becomes U+FFFD.
fn decode(bytes: &[u8], charset: &str) -> Result<String> {
    let utf16 = |b: &[u8], big: bool| -> String {
        let units: Vec<u16> = b
            .chunks(2)
            .map(|c| match c {
                [x, y] if big => u16::from_be_bytes([*x, *y]),
                [x, y] => u16::from_le_bytes([*x, *y]),
                _ => 0xFFFD,
            })
            .collect();
        String::from_utf16_lossy(&units)
    };
    Ok(match canonical(charset)? {
        "US-ASCII" => bytes
            .iter()
            .map(|b| if *b < 0x80 { char::from(*b) } else { '\u{FFFD}' })
            .collect(),
        "ISO-8859-1" => bytes.iter().map(|b| char::from(*b)).collect(),
        "UTF-8" => String::from_utf8_lossy(bytes).into_owned(),
        "UTF-16BE" => utf16(bytes, true),
        "UTF-16LE" => utf16(bytes, false),
        _ => match bytes {
            [0xFF, 0xFE, rest @ ..] => utf16(rest, false),
            [0xFE, 0xFF, rest @ ..] => utf16(rest, true),
            _ => utf16(bytes, true),
        },
    })
}

/// The standard charset `name` stands for (Java's names and aliases, any
/// case).
fn canonical(name: &str) -> Result<&'static str> {
    let n = name.trim().to_ascii_uppercase().replace('_', "-");
    Ok(match n.as_str() {
        "US-ASCII" | "ASCII" | "US" | "ISO646-US" | "ASCII7" | "646" | "CP367" | "DEFAULT" => "US-ASCII",
        "ISO-8859-1" | "ISO8859-1" | "ISO8859-1:1987" | "LATIN1" | "L1" | "ISO-LATIN-1" | "CP819" | "IBM819"
        | "819" => "ISO-8859-1",
        "UTF-8" | "UTF8" | "UNICODE-1-1-UTF-8" => "UTF-8",
        "UTF-16BE" | "UTF16BE" | "X-UTF-16BE" | "ISO-10646-UCS-2" => "UTF-16BE",
        "UTF-16LE" | "UTF16LE" | "X-UTF-16LE" => "UTF-16LE",
        "UTF-16" | "UTF16" => "UTF-16",
        _ => return exec_err!("unsupported charset '{name}'"),
    })
}

/// `UNHEX(s)`: the bytes of hex digits (either case); an odd count's
/// first digit is dropped and a zero byte leads (Flink's rule); NULL when
/// a character is not a hex digit.
fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text
        .chars()
        .map(|c| c.to_digit(16).map(|d| d as u8))
        .collect::<Option<_>>()?;
    let (mut out, pairs) = if digits.len() % 2 == 1 {
        (vec![0u8], &digits[1..])
    } else {
        (vec![], &digits[..])
    };
    out.extend(pairs.chunks(2).map(|p| p[0] << 4 | p[1]));
    Some(out)
}

impl ScalarUDFImpl for BytesFn {
    fn name(&self) -> &str {
        match self.op {
            Op::ToBase64 => "to_base64",
            Op::Unhex => "unhex",
            Op::Encode => "encode",
            Op::Decode => "decode",
            Op::HexOf => HEX_OF_BYTES,
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let name = self.flink_name();
        let wanted = match self.op {
            Op::ToBase64 | Op::Unhex | Op::HexOf => 1,
            Op::Encode | Op::Decode => 2,
        };
        if args.len() != wanted {
            return plan_err!("{name} takes {wanted} argument(s), not {}", args.len());
        }
        let first_ok = match self.op {
            Op::ToBase64 | Op::HexOf => is_text(&args[0]) || is_bytes(&args[0]),
            Op::Unhex | Op::Encode => is_text(&args[0]),
            Op::Decode => is_bytes(&args[0]) || args[0] == DataType::Null,
        };
        if !first_ok || args.get(1).is_some_and(|t| !is_text(t)) {
            let types: Vec<String> = args.iter().map(crate::types::flink_name).collect();
            return plan_err!("{name} does not take ({})", types.join(", "));
        }
        Ok(match self.op {
            Op::ToBase64 | Op::Decode | Op::HexOf => DataType::Utf8,
            Op::Unhex | Op::Encode => DataType::Binary,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let cols = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
        let name = self.flink_name();
        let first = byte_values(&cols[0])?;
        let charsets: Option<Vec<Option<String>>> = match cols.get(1) {
            Some(c) => {
                let c = cast(c, &DataType::Utf8)?;
                Some(c.as_string::<i32>().iter().map(|v| v.map(str::to_string)).collect())
            }
            None => None,
        };
        let charset = |i: usize| charsets.as_ref().and_then(|c| c[i].clone());
        let text_of = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let out: ArrayRef =
            match self.op {
                Op::ToBase64 | Op::Decode | Op::HexOf => {
                    let mut b = StringBuilder::with_capacity(rows, rows * 8);
                    for (i, v) in first.iter().enumerate() {
                        let Some(v) = v else {
                            b.append_null();
                            continue;
                        };
                        match self.op {
                            Op::ToBase64 => b.append_value(base64::engine::general_purpose::STANDARD.encode(v)),
                            Op::HexOf => b.append_value(v.iter().map(|x| format!("{x:02x}")).collect::<String>()),
                            _ => match charset(i) {
                                Some(cs) => b.append_value(decode(v, &cs).map_err(|e| {
                                    datafusion::error::DataFusionError::Execution(format!("{name}: {e}"))
                                })?),
                                None => b.append_null(),
                            },
                        }
                    }
                    Arc::new(b.finish())
                }
                Op::Unhex | Op::Encode => {
                    let mut b = BinaryBuilder::with_capacity(rows, rows * 8);
                    for (i, v) in first.iter().enumerate() {
                        let Some(v) = v else {
                            b.append_null();
                            continue;
                        };
                        let text = text_of(v);
                        match self.op {
                            Op::Unhex => b.append_option(unhex(&text)),
                            _ => match charset(i) {
                                Some(cs) => b.append_value(encode(&text, &cs).map_err(|e| {
                                    datafusion::error::DataFusionError::Execution(format!("{name}: {e}"))
                                })?),
                                None => b.append_null(),
                            },
                        }
                    }
                    Arc::new(b.finish())
                }
            };
        crate::udf::columnar(out, all_scalar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flink 2.3's answers (`TO_BASE64(ENCODE(s, 'UTF-16BE'))`, ...).
    #[test]
    fn bytes_as_flink_makes_them() {
        assert_eq!(unhex("414243"), Some(b"ABC".to_vec()));
        assert_eq!(
            unhex("abc"),
            Some(vec![0x00, 0xBC]),
            "odd: first digit dropped, zero byte first"
        );
        assert_eq!(unhex("4142G"), None);
        assert_eq!(unhex(""), Some(vec![]));
        let b64 = |b: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(b);
        assert_eq!(
            b64(encode("héllo wörld ß", "UTF-16BE").expect("utf-16be")),
            "AGgA6QBsAGwAbwAgAHcA9gByAGwAZAAgAN8="
        );
        assert_eq!(encode("héß", "iso-8859-1").expect("latin1"), vec![b'h', 0xE9, 0xDF]);
        assert_eq!(encode("hé", "US-ASCII").expect("ascii"), b"h?".to_vec());
        assert_eq!(encode("h", "UTF-16").expect("bom"), vec![0xFE, 0xFF, 0, b'h']);
        assert!(encode("x", "bogus").is_err());
        assert_eq!(decode(&[0xE9, 0xFF], "UTF-8").expect("lossy"), "\u{FFFD}\u{FFFD}");
        let le = encode("héllo", "UTF-16LE").expect("le");
        assert_eq!(decode(&le, "utf-16le").expect("le"), "héllo");
        assert_eq!(decode(&[0xFF, 0xFE, b'h', 0], "UTF-16").expect("bom"), "h");
        assert_eq!(decode(&[0xE9], "ISO-8859-1").expect("latin1"), "é");
    }
}
