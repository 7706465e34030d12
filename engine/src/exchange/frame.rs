//! The wire form of what flows on a channel between subtasks on different
//! worker processes: every [`StreamMessage`] (batches with their row
//! kinds, watermarks, idle/active status, barriers, end of input) and the
//! credits a receiver grants, each as one frame of a logical channel.
//!
//! A frame is a 9-byte header — logical channel (u32), kind (u8), payload
//! length (u32), little endian — and its payload. A batch is a flag (row
//! kinds or not), for changes the row count (u32) and one kind byte per
//! row, then an Arrow IPC stream (schema, the batch). Bytes from a peer are input: a frame
//! that does not decode is an error naming what is wrong, never a panic,
//! and no length is trusted beyond [`MAX_PAYLOAD`].

use std::io::Cursor;

use arrow::array::UInt8Array;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;

use crate::change::ChangeBatch;
use crate::message::{Barrier, BarrierKind, StreamMessage, WatermarkStatus};

/// Bytes of a frame's header.
pub const HEADER: usize = 9;
/// The largest payload a peer may send (a batch is a few MB; this bounds
/// what a corrupt length makes the receiver allocate).
pub const MAX_PAYLOAD: u32 = 256 << 20;

const BATCH: u8 = 1;
const WATERMARK: u8 = 2;
const STATUS: u8 = 3;
const BARRIER: u8 = 4;
const END: u8 = 5;
/// Receiver → sender: `n` more messages may be sent on the channel.
const CREDIT: u8 = 6;
/// The first frame on a connection: the connecting worker's index and
/// the hash of its job's plan.
const HELLO: u8 = 7;
/// The job's control plane (worker 0 ↔ the others): an opaque payload
/// (JSON, see [`super::control`]) outside any data channel's credits.
const CONTROL: u8 = 8;
/// A heartbeat: nothing but proof the peer is alive and reachable.
const PING: u8 = 9;

/// One frame's meaning.
#[derive(Debug, Clone)]
pub enum Frame {
    Message(StreamMessage),
    Credit(u32),
    /// The connecting worker's index and the hash of the job's plan (a
    /// worker started with other SQL is refused).
    Hello {
        worker: u32,
        plan: u64,
    },
    /// A control-plane message (checkpoint triggers and acknowledgements,
    /// the attempt's start, the end): few and small, so not credited.
    Control(Vec<u8>),
    /// A heartbeat (sent every second whatever else flows).
    Ping,
}

/// A frame that does not decode: what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("channel {channel}: {message}")]
pub struct FrameError {
    pub channel: u32,
    pub message: String,
}

/// The header of a frame: its channel, kind and payload length.
pub fn header(bytes: &[u8; HEADER]) -> Result<(u32, u8, u32), FrameError> {
    let channel = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let kind = bytes[4];
    let len = u32::from_le_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
    if len > MAX_PAYLOAD {
        return Err(FrameError {
            channel,
            message: format!("a frame of {len} bytes (at most {MAX_PAYLOAD})"),
        });
    }
    Ok((channel, kind, len))
}

/// `frame` of `channel`, header and payload, appended to `out`.
pub fn encode(channel: u32, frame: &Frame, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    let kind = match frame {
        Frame::Message(StreamMessage::Batch(b)) => {
            match &b.kinds {
                Some(k) => {
                    out.push(1);
                    let n = u32::try_from(k.len()).map_err(|_| FrameError {
                        channel,
                        message: format!("a batch of {} rows", k.len()),
                    })?;
                    out.extend_from_slice(&n.to_le_bytes());
                    out.extend_from_slice(k.values());
                }
                None => out.push(0),
            }
            let mut w = StreamWriter::try_new(&mut *out, &b.rows.schema()).map_err(|e| FrameError {
                channel,
                message: format!("cannot encode a batch: {e}"),
            })?;
            w.write(&b.rows).and_then(|_| w.finish()).map_err(|e| FrameError {
                channel,
                message: format!("cannot encode a batch: {e}"),
            })?;
            BATCH
        }
        Frame::Message(StreamMessage::Watermark(w)) => {
            out.extend_from_slice(&w.to_le_bytes());
            WATERMARK
        }
        Frame::Message(StreamMessage::WatermarkStatus(s)) => {
            out.push(u8::from(*s == WatermarkStatus::Idle));
            STATUS
        }
        Frame::Message(StreamMessage::Barrier(b)) => {
            out.extend_from_slice(&b.checkpoint_id.to_le_bytes());
            out.extend_from_slice(&b.timestamp.to_le_bytes());
            out.push(match b.kind {
                BarrierKind::Checkpoint => 0,
                BarrierKind::Savepoint { stop, drain } => 1 | (u8::from(stop) << 1) | (u8::from(drain) << 2),
            });
            BARRIER
        }
        Frame::Message(StreamMessage::EndOfInput) => END,
        Frame::Credit(n) => {
            out.extend_from_slice(&n.to_le_bytes());
            CREDIT
        }
        Frame::Hello { worker, plan } => {
            out.extend_from_slice(&worker.to_le_bytes());
            out.extend_from_slice(&plan.to_le_bytes());
            HELLO
        }
        Frame::Control(bytes) => {
            out.extend_from_slice(bytes);
            CONTROL
        }
        Frame::Ping => PING,
    };
    let len = out.len() - start - HEADER;
    let len = u32::try_from(len)
        .ok()
        .filter(|l| *l <= MAX_PAYLOAD)
        .ok_or_else(|| FrameError {
            channel,
            message: format!("a frame of {len} bytes (at most {MAX_PAYLOAD}): send smaller batches"),
        })?;
    out[start..start + 4].copy_from_slice(&channel.to_le_bytes());
    out[start + 4] = kind;
    out[start + 5..start + HEADER].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// The frame of `kind` with `payload`, on `channel`.
pub fn decode(channel: u32, kind: u8, payload: &[u8]) -> Result<Frame, FrameError> {
    let bad = |message: String| FrameError { channel, message };
    let fixed = |n: usize| -> Result<&[u8], FrameError> {
        if payload.len() == n {
            Ok(payload)
        } else {
            Err(bad(format!(
                "a frame of kind {kind} has {} payload bytes, not {n}",
                payload.len()
            )))
        }
    };
    let u64_at = |b: &[u8], at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at..at + 8]);
        a
    };
    Ok(match kind {
        BATCH => {
            let (&has_kinds, rest) = payload
                .split_first()
                .ok_or_else(|| bad("an empty batch frame".into()))?;
            let kinds_and_ipc = rest;
            let probe = |ipc: &[u8]| -> Result<arrow::record_batch::RecordBatch, FrameError> {
                let mut r = StreamReader::try_new(Cursor::new(ipc), None)
                    .map_err(|e| bad(format!("not an Arrow IPC stream: {e}")))?;
                let batch = r
                    .next()
                    .ok_or_else(|| bad("an Arrow IPC stream without a batch".into()))?
                    .map_err(|e| bad(format!("not an Arrow IPC batch: {e}")))?;
                if r.next().is_some() {
                    return Err(bad("more than one batch in a frame".into()));
                }
                Ok(batch)
            };
            match has_kinds {
                0 => StreamMessage::Batch(ChangeBatch::from(probe(kinds_and_ipc)?)).into_frame(),
                1 => {
                    // The row kinds (a count, then a byte each) come first.
                    if kinds_and_ipc.len() < 4 {
                        return Err(bad("a batch frame cut off in its row kinds".into()));
                    }
                    let (count, rest) = kinds_and_ipc.split_at(4);
                    let n = u32::from_le_bytes([count[0], count[1], count[2], count[3]]) as usize;
                    if rest.len() < n {
                        return Err(bad(format!("{n} row kinds announced, {} bytes follow", rest.len())));
                    }
                    let (kinds, ipc) = rest.split_at(n);
                    if let Some(k) = kinds.iter().find(|k| **k > 3) {
                        return Err(bad(format!("row kind {k} (0..=3)")));
                    }
                    let rows = probe(ipc)?;
                    if kinds.len() != rows.num_rows() {
                        return Err(bad(format!(
                            "{} row kinds for a batch of {} rows",
                            kinds.len(),
                            rows.num_rows()
                        )));
                    }
                    StreamMessage::Batch(ChangeBatch {
                        rows,
                        kinds: Some(UInt8Array::from(kinds.to_vec())),
                    })
                    .into_frame()
                }
                other => return Err(bad(format!("batch flag {other} (0 or 1)"))),
            }
        }
        WATERMARK => StreamMessage::Watermark(i64::from_le_bytes(u64_at(fixed(8)?, 0))).into_frame(),
        STATUS => match fixed(1)?[0] {
            0 => StreamMessage::WatermarkStatus(WatermarkStatus::Active).into_frame(),
            1 => StreamMessage::WatermarkStatus(WatermarkStatus::Idle).into_frame(),
            other => return Err(bad(format!("watermark status {other} (0 or 1)"))),
        },
        BARRIER => {
            let b = fixed(17)?;
            let kind = match b[16] {
                0 => BarrierKind::Checkpoint,
                k if k & 1 == 1 && k < 8 => BarrierKind::Savepoint {
                    stop: k & 2 != 0,
                    drain: k & 4 != 0,
                },
                other => return Err(bad(format!("barrier kind {other}"))),
            };
            StreamMessage::Barrier(Barrier {
                checkpoint_id: u64::from_le_bytes(u64_at(b, 0)),
                timestamp: i64::from_le_bytes(u64_at(b, 8)),
                kind,
            })
            .into_frame()
        }
        END => {
            fixed(0)?;
            StreamMessage::EndOfInput.into_frame()
        }
        CREDIT => {
            let b = fixed(4)?;
            Frame::Credit(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        HELLO => {
            let b = fixed(12)?;
            Frame::Hello {
                worker: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                plan: u64::from_le_bytes(u64_at(b, 4)),
            }
        }
        CONTROL => Frame::Control(payload.to_vec()),
        PING => {
            fixed(0)?;
            Frame::Ping
        }
        other => return Err(bad(format!("unknown frame kind {other}"))),
    })
}

impl StreamMessage {
    fn into_frame(self) -> Frame {
        Frame::Message(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use std::sync::Arc;

    fn batch(n: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(StringArray::from_iter(
                    (0..n).map(|i| (i % 3 != 0).then(|| format!("s{i}"))),
                )),
            ],
        )
        .expect("batch")
    }

    fn round_trip(frame: &Frame) -> Frame {
        let mut out = vec![];
        encode(42, frame, &mut out).expect("encode");
        let head: [u8; HEADER] = out[..HEADER].try_into().expect("header");
        let (channel, kind, len) = header(&head).expect("header");
        assert_eq!((channel, len as usize), (42, out.len() - HEADER));
        decode(channel, kind, &out[HEADER..]).expect("decode")
    }

    #[test]
    fn every_message_survives_the_wire() {
        let messages = vec![
            StreamMessage::Batch(batch(5).into()),
            StreamMessage::Batch(ChangeBatch {
                rows: batch(4),
                kinds: Some(UInt8Array::from(vec![0, 1, 2, 3])),
            }),
            StreamMessage::Batch(batch(0).into()),
            StreamMessage::Watermark(-7),
            StreamMessage::Watermark(i64::MAX),
            StreamMessage::WatermarkStatus(WatermarkStatus::Idle),
            StreamMessage::WatermarkStatus(WatermarkStatus::Active),
            StreamMessage::Barrier(Barrier {
                checkpoint_id: 9,
                timestamp: 1_700_000_000_000,
                kind: BarrierKind::Checkpoint,
            }),
            StreamMessage::Barrier(Barrier {
                checkpoint_id: u64::MAX,
                timestamp: -1,
                kind: BarrierKind::Savepoint {
                    stop: true,
                    drain: false,
                },
            }),
            StreamMessage::EndOfInput,
        ];
        for m in messages {
            let back = round_trip(&Frame::Message(m.clone()));
            let Frame::Message(back) = back else {
                panic!("not a message: {back:?}")
            };
            assert_eq!(format!("{back:?}"), format!("{m:?}"));
        }
        assert!(matches!(round_trip(&Frame::Credit(17)), Frame::Credit(17)));
        assert!(matches!(
            round_trip(&Frame::Hello { worker: 2, plan: 7 }),
            Frame::Hello { worker: 2, plan: 7 }
        ));
    }

    #[test]
    fn bytes_that_are_not_a_frame_are_errors_naming_the_channel() {
        assert!(header(&[1, 0, 0, 0, BATCH, 0xff, 0xff, 0xff, 0xff]).is_err());
        for (kind, payload) in [
            (WATERMARK, vec![1u8, 2, 3]),
            (STATUS, vec![2]),
            (BARRIER, vec![0; 17].into_iter().chain([9]).collect()),
            (BATCH, vec![]),
            (BATCH, vec![0, 1, 2, 3]),
            (BATCH, vec![1, 0, 1]),
            (BATCH, vec![1, 9, 0, 0, 0, 1]),
            (BATCH, vec![5]),
            (99, vec![]),
        ] {
            let e = decode(3, kind, &payload).expect_err("refused");
            assert_eq!(e.channel, 3);
        }
        // Row kinds that do not match the batch's rows.
        let mut out = vec![];
        encode(
            1,
            &Frame::Message(StreamMessage::Batch(ChangeBatch {
                rows: batch(3),
                kinds: Some(UInt8Array::from(vec![0, 1, 2])),
            })),
            &mut out,
        )
        .expect("encode");
        let mut payload = out[HEADER..].to_vec();
        // Two kinds announced (and the third byte read as the stream).
        payload[1] = 2;
        assert!(decode(1, BATCH, &payload).is_err());
        // A kind out of range.
        let mut payload = out[HEADER..].to_vec();
        payload[5] = 7;
        assert!(
            decode(1, BATCH, &payload)
                .expect_err("refused")
                .message
                .contains("row kind 7")
        );
    }
}
