use clap::Parser;

// mimalloc keeps freed memory for reuse: with glibc's allocator, batch-sized
// buffers (hundreds of KB, above its mmap threshold) went back to the
// kernel and were faulted in afresh, a tenth of a CSV scan's time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,weir::checkpoint=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    weir_engine::exchange::tls::install_crypto_provider();
    let args = weir::cli::Args::parse();
    std::process::exit(weir::cli::main_with(args));
}
