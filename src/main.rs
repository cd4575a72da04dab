//! The `tokenmeter` binary: parses the command line and runs the chosen mode.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use tokenmeter_flags::ProxyArgs;
use tracing_subscriber::EnvFilter;

/// jemalloc, with its background thread returning unused pages to the system: after a burst
/// of 5,000 streams the proxy is back near its idle RSS within seconds, where glibc's malloc
/// held 100 MiB for good; and it costs less CPU per chunk (docs/bench.md, "The allocator").
#[cfg(all(feature = "jemalloc", unix, not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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

// Parsed once per process: boxing the proxy's flags would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default when no subcommand is given).
    Proxy(ProxyArgs),
    /// Load-test an OpenAI-compatible server: per-request vs aggregate tokens/s by concurrency.
    Bench(tokenmeter_tools::bench::BenchArgs),
    /// Run a simulated inference server (continuous batching, OpenAI/Anthropic/Ollama/TGI APIs).
    Sim(tokenmeter_tools::sim::SimArgs),
    /// Run the simulator, the proxy in front of it and a ramping load, with a live table.
    Demo(tokenmeter_tools::demo::DemoArgs),
    /// Read a running tokenmeter's live capacity model: the fit, a table per SLO class, the
    /// curve, and the chart as SVG; with --trace, the highest rate multiple of a recorded
    /// traffic each class holds on the fitted engine.
    Capacity(tokenmeter_tools::capacity_command::CapacityArgs),
    /// Read who used the GPUs: GPU time by tenant and model, prefill and decode, share, per
    /// million output tokens, dollars, and idle, from a running tokenmeter over a window, or
    /// from Prometheus over a range, summed over the fleet.
    Cost(tokenmeter_tools::cost_command::CostArgs),
}

/// Exit code for a configuration the user must fix (BSD's EX_USAGE).
const EXIT_USAGE: u8 = 64;

/// Exit code for an input file a command cannot read (`capacity --trace`: a line that is not a
/// request, an empty trace), as grep and diff use 2 for trouble: a script tells a bad file from
/// a server that is not there (1).
const EXIT_BAD_INPUT: u8 = 2;

/// The exit code of a subcommand: a one-line error, 64 for bad flags.
fn exit<E: std::fmt::Display>(r: Result<(), E>, is_usage: impl Fn(&E) -> bool) -> ExitCode {
    exit_with(r, |e| if is_usage(e) { EXIT_USAGE } else { 1 })
}

/// The exit code of a subcommand: a one-line error and the code `code` gives it.
fn exit_with<E: std::fmt::Display>(r: Result<(), E>, code: impl Fn(&E) -> u8) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokenmeter: error: {e}");
            ExitCode::from(code(&e))
        }
    }
}

/// The command line, or the exit a bad one earns. clap's own errors (an unknown flag, a value of
/// the wrong type, in a flag or its environment variable) would exit 2 with a usage block; they
/// get the same one line and code 64 as every other bad flag, so a supervisor or a script sees
/// one contract. `--help` and `--version` still print and exit 0.
fn parse() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            e.exit()
        }
        Err(e) => {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            let line = first.strip_prefix("error: ").unwrap_or(first);
            let args: Vec<String> = std::env::args().skip(1).collect();
            match mistyped(&e, &args) {
                Some(meant) => {
                    eprintln!("tokenmeter: error: {line}; did you mean `{meant}`? (see --help)")
                }
                None => eprintln!("tokenmeter: error: {line} (see --help)"),
            }
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// For an unknown argument, the flag (or, at the top, the subcommand) it was most likely meant
/// to be, among those of the command it was given to: clap's own hint is on a second line,
/// which the one-line error drops.
fn mistyped(e: &clap::Error, args: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = match e.kind() {
        ErrorKind::UnknownArgument => ContextKind::InvalidArg,
        ErrorKind::InvalidSubcommand => ContextKind::InvalidSubcommand,
        _ => return None,
    };
    let Some(ContextValue::String(typed)) = e.get(context) else {
        return None;
    };
    // `--upsteam=http://x` is reported with its value on some paths: the name is before `=`.
    let typed = typed.split('=').next().unwrap_or(typed);
    let root = Cli::command();
    // The subcommand the flags were given to: the first argument that names one. The proxy's
    // flags take URLs, addresses and numbers, never a subcommand's name, so a value is not
    // mistaken for one.
    let cmd = args
        .iter()
        .find_map(|a| root.find_subcommand(a))
        .unwrap_or(&root);
    let at_root = std::ptr::eq(cmd, &root);
    // Only the top level has --version (clap does not hand it down).
    let builtin: &[&str] = if at_root {
        &["help", "version"]
    } else {
        &["help"]
    };
    let flags: Vec<String> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .chain(builtin.iter().copied())
        .map(|l| format!("--{l}"))
        .collect();
    if typed.starts_with('-') {
        tokenmeter_flags::suggest::closest(typed, flags.iter().map(String::as_str))
            .map(str::to_owned)
    } else if at_root {
        // A word where a subcommand goes: `tokenmeter bnech`.
        let names: Vec<&str> = root.get_subcommands().map(|c| c.get_name()).collect();
        tokenmeter_flags::suggest::closest(typed, names).map(str::to_owned)
    } else {
        None
    }
}

/// Whether the log is coloured: only for a person at a terminal, and not when `NO_COLOR` is set
/// to anything (<https://no-color.org>). A file, a pipe or `kubectl logs` would otherwise keep
/// the escape codes as noise in every line, and a log shipper would index them.
fn colour(terminal: bool, no_color: Option<OsString>) -> bool {
    // Set but empty counts as unset, as the convention says.
    terminal && !matches!(no_color, Some(v) if !v.is_empty())
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // h2 warns once per connection that trips a flood limit: under a rapid-reset flood that
    // is thousands of lines a second, a flood of the log in turn. The GOAWAY is the answer.
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("TOKENMETER_LOG")
                .unwrap_or_else(|_| EnvFilter::new("info,h2=error")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .init();
    let args = match cli.command {
        Some(Command::Proxy(args)) => args,
        Some(Command::Bench(args)) => return tokenmeter_tools::bench::main(&args),
        Some(Command::Sim(args)) => {
            return exit(tokenmeter_tools::sim::run(&args), |e| e.is_usage())
        }
        Some(Command::Demo(args)) => {
            return exit(tokenmeter_tools::demo::run(&args), |e| e.is_usage())
        }
        Some(Command::Cost(args)) => {
            return exit(tokenmeter_tools::cost_command::run(&args), |e| e.is_usage())
        }
        Some(Command::Capacity(args)) => {
            return exit_with(tokenmeter_tools::capacity_command::run(&args), |e| {
                if e.is_usage() {
                    EXIT_USAGE
                } else if e.is_bad_input() {
                    EXIT_BAD_INPUT
                } else {
                    1
                }
            })
        }
        None => cli.proxy,
    };
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tokenmeter: error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    for note in &cfg.gpu_notes {
        if note.warn {
            tracing::warn!("{}", note.text);
        } else {
            tracing::info!("{}", note.text);
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tokenmeter: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let server = match tokenmeter::app::build(&cfg).await {
            Ok(app) => app.server,
            Err(e) => {
                eprintln!("tokenmeter: error: {e}");
                return if e.is_usage() {
                    ExitCode::from(EXIT_USAGE)
                } else {
                    ExitCode::FAILURE
                };
            }
        };
        tracing::info!(
            listen = %server.proxy_addr(),
            metrics = %server.metrics_addr(),
            upstream = %cfg.proxy.upstream.origin,
            "tokenmeter started"
        );
        server.serve(tokenmeter::signal::shutdown()).await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_at_a_terminal_and_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsString::new())), "empty is unset");
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(true, Some("0".into())), "any value turns it off");
        assert!(!colour(false, None), "a file or a pipe");
        assert!(!colour(false, Some(OsString::new())));
    }
}
