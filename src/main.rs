use clap::Parser;

// mimalloc keeps freed memory for reuse: with glibc's allocator, batch-sized
// buffers (hundreds of KB, above its mmap threshold) went back to the
// kernel and were faulted in afresh, a tenth of a CSV scan's time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    disable_transparent_huge_pages();
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

/// Turns transparent huge pages off for this process, before the engine
/// allocates much. mimalloc asks for huge pages on its arenas, returns freed
/// pages to the kernel after a few milliseconds, and the next touch of such a page
/// faults in and zeroes 2 MiB: a Delta sink at parallelism 2 spent a third
/// of its CPU in `clear_page_erms` (parquet's async writer takes a fresh
/// buffer per row group, freed on another thread), and ran at 0.55x the
/// Parquet file sink; without huge pages, 0.9x. Nexmark q0/q4/q5/q10 were
/// unchanged or faster (docs/benchmarks.md); RocksDB advises against THP too.
/// `WEIR_THP=1` keeps them (a machine where they measure faster).
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("WEIR_THP").is_none_or(|v| v != "1") {
        // A failure (a kernel before 3.15) leaves them on: slower, not wrong.
        let _ = nix::sys::prctl::set_thp_disable(true);
    }
}
