//! The `tokenmeter` binary: parses the command line and runs the chosen mode.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokenmeter::config::ProxyArgs;
use tokenmeter::server::Server;
use tracing_subscriber::EnvFilter;

/// A streaming reverse proxy for LLM inference servers that exports TTFT, per-request and
/// aggregate tokens/s (at stated concurrency) as Prometheus metrics.
#[derive(Parser)]
#[command(name = "tokenmeter", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    proxy: ProxyArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default when no subcommand is given).
    Proxy(ProxyArgs),
    /// Load-test an OpenAI-compatible server: per-request vs aggregate tokens/s by concurrency.
    Bench(tokenmeter::bench::BenchArgs),
}

/// Exit code for a configuration the user must fix (BSD's EX_USAGE).
const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("TOKENMETER_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = match cli.command {
        Some(Command::Proxy(args)) => args,
        Some(Command::Bench(args)) => return run_bench(&args),
        None => cli.proxy,
    };
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tokenmeter: error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tokenmeter: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let server = match Server::bind(&cfg).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("tokenmeter: error: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(
            listen = %server.proxy_addr(),
            metrics = %server.metrics_addr(),
            upstream = %cfg.upstream.origin,
            "tokenmeter started"
        );
        server.serve(tokenmeter::signal::shutdown()).await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

fn run_bench(args: &tokenmeter::bench::BenchArgs) -> ExitCode {
    use tokenmeter::bench;
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tokenmeter bench: error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tokenmeter bench: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let interrupted = bench::interrupt_on_ctrl_c();
        let r = bench::run(&cfg, bench::progress::Progress::new(), interrupted.clone()).await;
        (r, interrupted.load(std::sync::atomic::Ordering::Relaxed))
    });
    match result {
        (Ok(_), interrupted) => {
            for f in [
                bench::JSON_FILE,
                bench::CSV_FILE,
                bench::THROUGHPUT_SVG,
                bench::TTFT_SVG,
            ] {
                println!("wrote {}", cfg.out.join(f).display());
            }
            // 128 + SIGINT, as a shell reports a run stopped with Ctrl-C.
            ExitCode::from(if interrupted { 130 } else { 0 })
        }
        (Err(e), _) => {
            eprintln!("tokenmeter bench: error: {e}");
            ExitCode::from(if e.is_usage() { EXIT_USAGE } else { 1 })
        }
    }
}
