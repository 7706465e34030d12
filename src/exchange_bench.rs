//! `weir bench exchange`: the network exchange between worker processes
//! (issue 42) over loopback: Nexmark-shaped bid batches (all seven
//! columns, the strings as the generator makes them) sent on one
//! connection by 1 and by several logical channels at once, each with its
//! credits; beside the encode and decode alone (no network) and an
//! in-memory channel (what a local edge costs), and beside Arrow Flight
//! `DoExchange` with the same batches (one gRPC stream per channel on one
//! HTTP/2 connection: the alternative to Weir's framing). Reports rows/s
//! and MB/s of Arrow IPC frames.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use clap::Args;
use weir_engine::change::ChangeBatch;
use weir_engine::connectors::nexmark::generator::{EventTime, Rng, bid, channel_and_url};
use weir_engine::exchange::frame::{self, Frame};
use weir_engine::exchange::link::Link;
use weir_engine::message::StreamMessage;

#[derive(Args, Debug, Clone)]
pub struct ExchangeArgs {
    /// Bid rows sent in each measurement (split over the channels).
    #[arg(long, default_value_t = 4_000_000)]
    pub rows: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 8192)]
    pub batch_rows: usize,
    /// Comma-separated channel counts to measure, sending at once on one
    /// connection.
    #[arg(long, default_value = "1,4")]
    pub channels: String,
    /// Credits (messages a receiver buffers) per channel.
    #[arg(long, default_value_t = 8)]
    pub credits: u32,
}

/// Distinct bid batches, reused in turn (generation is not measured).
fn batches(rows: usize, count: usize) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, false),
        Field::new("url", DataType::Utf8, false),
        Field::new("dateTime", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        Field::new("extra", DataType::Utf8, false),
    ]));
    let time = EventTime {
        base_time_ms: 1_700_000_000_000,
        first_event_rate: 10_000_000,
    };
    (0..count)
        .map(|b| {
            let mut rng = Rng::new(42, b as u64);
            let (mut auction, mut bidder, mut price, mut channel, mut url, mut at, mut extra) =
                (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
            for i in 0..rows {
                let n = (b * rows + i) as u64;
                let x = bid(n, &mut rng, &time);
                let (c, u) = channel_and_url(x.channel);
                let mut e = String::new();
                // Nexmark's average bid is 100 bytes, the extra pads to it.
                rng.push_extra(&mut e, 8 * 3 + c.len() + u.len() + 8, 100);
                auction.push(x.auction);
                bidder.push(x.bidder);
                price.push(x.price);
                channel.push(c);
                url.push(u);
                at.push(x.date_time);
                extra.push(e);
            }
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(auction)),
                Arc::new(Int64Array::from(bidder)),
                Arc::new(Int64Array::from(price)),
                Arc::new(StringArray::from(channel)),
                Arc::new(StringArray::from(url)),
                Arc::new(TimestampMillisecondArray::from(at)),
                Arc::new(StringArray::from(extra)),
            ];
            RecordBatch::try_new(schema.clone(), columns).expect("the bid schema")
        })
        .collect()
}

fn report(what: &str, rows: u64, bytes: u64, secs: f64) {
    println!(
        "{what:<44} {:>8.2} M rows/s  {:>8.1} MB/s  ({rows} rows, {:.1} MB, {secs:.2} s)",
        rows as f64 / secs / 1e6,
        bytes as f64 / secs / 1e6,
        bytes as f64 / 1e6
    );
}

pub async fn run_exchange(args: &ExchangeArgs) -> i32 {
    match figures(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

async fn figures(args: &ExchangeArgs) -> Result<(), String> {
    let batch_rows = args.batch_rows.max(1);
    let templates = batches(batch_rows, 16);
    let sizes: Vec<u64> = templates
        .iter()
        .map(|b| {
            let mut out = vec![];
            frame::encode(0, &Frame::Message(StreamMessage::Batch(b.clone().into())), &mut out)
                .map(|_| out.len() as u64)
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let count = args.rows.div_ceil(batch_rows as u64);
    let rows = count * batch_rows as u64;
    let bytes: u64 = (0..count).map(|i| sizes[i as usize % sizes.len()]).sum();
    println!(
        "bids: 7 columns, {batch_rows} rows a batch, {:.0} bytes a row in a frame; {} credits a channel",
        sizes.iter().sum::<u64>() as f64 / (sizes.len() * batch_rows) as f64,
        args.credits
    );

    // Encode and decode alone, one thread.
    let start = Instant::now();
    let mut out = Vec::with_capacity(sizes[0] as usize * 2);
    for i in 0..count {
        out.clear();
        let b: ChangeBatch = templates[i as usize % templates.len()].clone().into();
        frame::encode(0, &Frame::Message(StreamMessage::Batch(b)), &mut out).map_err(|e| e.to_string())?;
        let head: [u8; frame::HEADER] = out[..frame::HEADER].try_into().map_err(|_| "a short frame")?;
        let (c, k, _) = frame::header(&head).map_err(|e| e.to_string())?;
        frame::decode(c, k, &out[frame::HEADER..]).map_err(|e| e.to_string())?;
    }
    report(
        "encode + decode, no network",
        rows,
        bytes,
        start.elapsed().as_secs_f64(),
    );

    // An in-memory channel of the same capacity: a local edge.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<StreamMessage>(args.credits.max(1) as usize);
    let start = Instant::now();
    let t = templates.clone();
    let sender = tokio::spawn(async move {
        for i in 0..count {
            let b: ChangeBatch = t[i as usize % t.len()].clone().into();
            if tx.send(StreamMessage::Batch(b)).await.is_err() {
                break;
            }
        }
    });
    let mut got = 0u64;
    while let Some(StreamMessage::Batch(b)) = rx.recv().await {
        got += b.rows.num_rows() as u64;
    }
    sender.await.map_err(|e| e.to_string())?;
    report(
        "in-memory channel (a local edge)",
        got,
        bytes,
        start.elapsed().as_secs_f64(),
    );

    for channels in args.channels.split(',').filter_map(|c| c.trim().parse::<u32>().ok()) {
        let channels = channels.max(1);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?.to_string();
        let accepted = tokio::spawn(async move {
            let (s, _) = listener.accept().await.map_err(|e| e.to_string())?;
            Link::accept(s).await.map_err(|e| e.to_string())
        });
        let a = Link::connect(&addr, 0, 0, 1).await.map_err(|e| e.to_string())?;
        let (_, _, b) = accepted.await.map_err(|e| e.to_string())??;
        let per_channel = count.div_ceil(u64::from(channels));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for ch in 0..channels {
            let tx = a.sender(ch).map_err(|e| e.to_string())?;
            let mut rx = b.receiver(ch, args.credits).map_err(|e| e.to_string())?;
            let t = templates.clone();
            tasks.spawn(async move {
                for i in 0..per_channel {
                    let batch: ChangeBatch = t[(i as usize + ch as usize) % t.len()].clone().into();
                    tx.send(StreamMessage::Batch(batch)).await.map_err(|e| e.to_string())?;
                }
                tx.send(StreamMessage::EndOfInput).await.map_err(|e| e.to_string())?;
                Ok::<u64, String>(0)
            });
            tasks.spawn(async move {
                let mut got = 0u64;
                loop {
                    match rx.recv().await {
                        Some(StreamMessage::Batch(b)) => got += b.rows.num_rows() as u64,
                        Some(StreamMessage::EndOfInput) => return Ok(got),
                        Some(_) => {}
                        None => return Err("the connection was lost".to_string()),
                    }
                }
            });
        }
        let mut got = 0u64;
        while let Some(r) = tasks.join_next().await {
            got += r.map_err(|e| e.to_string())??;
        }
        let secs = start.elapsed().as_secs_f64();
        let sent_bytes = bytes * (per_channel * u64::from(channels)) / count.max(1);
        report(
            &format!("TCP loopback, {channels} channel(s) on one connection"),
            got,
            sent_bytes,
            secs,
        );
        if channels > 1 {
            println!(
                "{:<44} {:>8.2} M rows/s per channel",
                "",
                got as f64 / secs / 1e6 / f64::from(channels)
            );
        }
    }
    // The alternative the issue named: Arrow Flight `DoExchange`, one gRPC
    // stream per channel on one HTTP/2 connection, the same batches.
    for channels in args.channels.split(',').filter_map(|c| c.trim().parse::<u32>().ok()) {
        let channels = channels.max(1);
        let per_channel = count.div_ceil(u64::from(channels));
        let (got, secs) = flight_exchange(&templates, channels, per_channel).await?;
        let sent_bytes = bytes * (per_channel * u64::from(channels)) / count.max(1);
        report(
            &format!("Flight DoExchange, {channels} stream(s) on one connection"),
            got,
            sent_bytes,
            secs,
        );
    }
    Ok(())
}

/// Sends `per_channel` batches on each of `channels` `DoExchange` streams
/// of one connection to a Flight server in this process that decodes and
/// counts them; the rows it counted, and the seconds it took.
async fn flight_exchange(templates: &[RecordBatch], channels: u32, per_channel: u64) -> Result<(u64, f64), String> {
    use arrow_flight::flight_service_server::FlightServiceServer;
    use futures::TryStreamExt;
    let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let service = FlightServiceServer::new(CountingSink(counted.clone()))
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for ch in 0..channels {
        let mut client = arrow_flight::FlightClient::new(channel.clone());
        let t = templates.to_vec();
        calls.spawn(async move {
            let input = futures::stream::iter(
                (0..per_channel).map(move |i| Ok(t[(i as usize + ch as usize) % t.len()].clone())),
            );
            let data = arrow_flight::encode::FlightDataEncoderBuilder::new().build(input);
            let mut answer = client.do_exchange(data).await.map_err(|e| e.to_string())?;
            while answer.try_next().await.map_err(|e| e.to_string())?.is_some() {}
            Ok::<(), String>(())
        });
    }
    while let Some(r) = calls.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    let secs = start.elapsed().as_secs_f64();
    server.abort();
    Ok((counted.load(std::sync::atomic::Ordering::Relaxed), secs))
}

/// The listener's connections as the stream tonic serves.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        });
        Some((next, l))
    })
}

/// A Flight service whose `DoExchange` decodes the batches it is sent and
/// counts their rows (the bench's receiving side); nothing else.
struct CountingSink(Arc<std::sync::atomic::AtomicU64>);

type Answer<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl arrow_flight::flight_service_server::FlightService for CountingSink {
    type HandshakeStream = Answer<arrow_flight::HandshakeResponse>;
    type ListFlightsStream = Answer<arrow_flight::FlightInfo>;
    type DoGetStream = Answer<arrow_flight::FlightData>;
    type DoPutStream = Answer<arrow_flight::PutResult>;
    type DoExchangeStream = Answer<arrow_flight::FlightData>;
    type DoActionStream = Answer<arrow_flight::Result>;
    type ListActionsStream = Answer<arrow_flight::ActionType>;

    async fn handshake(
        &self,
        _: tonic::Request<tonic::Streaming<arrow_flight::HandshakeRequest>>,
    ) -> Result<tonic::Response<Self::HandshakeStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn list_flights(
        &self,
        _: tonic::Request<arrow_flight::Criteria>,
    ) -> Result<tonic::Response<Self::ListFlightsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn get_flight_info(
        &self,
        _: tonic::Request<arrow_flight::FlightDescriptor>,
    ) -> Result<tonic::Response<arrow_flight::FlightInfo>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn poll_flight_info(
        &self,
        _: tonic::Request<arrow_flight::FlightDescriptor>,
    ) -> Result<tonic::Response<arrow_flight::PollInfo>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn get_schema(
        &self,
        _: tonic::Request<arrow_flight::FlightDescriptor>,
    ) -> Result<tonic::Response<arrow_flight::SchemaResult>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn do_get(
        &self,
        _: tonic::Request<arrow_flight::Ticket>,
    ) -> Result<tonic::Response<Self::DoGetStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn do_put(
        &self,
        _: tonic::Request<tonic::Streaming<arrow_flight::FlightData>>,
    ) -> Result<tonic::Response<Self::DoPutStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn do_exchange(
        &self,
        request: tonic::Request<tonic::Streaming<arrow_flight::FlightData>>,
    ) -> Result<tonic::Response<Self::DoExchangeStream>, tonic::Status> {
        use futures::{StreamExt, TryStreamExt};
        let counted = self.0.clone();
        let data = request.into_inner().map_err(arrow_flight::error::FlightError::from);
        let mut batches = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(data);
        // Read everything, then answer with nothing: the client's call
        // ends once every batch was decoded here.
        let answer = futures::stream::once(async move {
            while let Some(b) = batches
                .try_next()
                .await
                .map_err(|e| tonic::Status::internal(e.to_string()))?
            {
                counted.fetch_add(b.num_rows() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<Option<arrow_flight::FlightData>, tonic::Status>(None)
        })
        .filter_map(|r| futures::future::ready(r.transpose()));
        Ok(tonic::Response::new(Box::pin(answer)))
    }
    async fn do_action(
        &self,
        _: tonic::Request<arrow_flight::Action>,
    ) -> Result<tonic::Response<Self::DoActionStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
    async fn list_actions(
        &self,
        _: tonic::Request<arrow_flight::Empty>,
    ) -> Result<tonic::Response<Self::ListActionsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bench sink"))
    }
}
