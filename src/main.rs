//! Thin entry point: an owner-only umask (`077`), then parse the command line, load settings, start logging,
//! dispatch (`serve` to `startup`, every other command to `cli::run_command`).

#![deny(unsafe_code)]

use std::process::ExitCode;

use blobgate::cli::{Cli, Command};
use blobgate::config::LogFormat;
use blobgate::startup::{Application, shutdown_signal};
use clap::Parser;

/// jemalloc, configured in `blobgate::driver::sys` (huge pages, freed memory returned by a background thread).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Owner-only files whatever the caller's umask: the database holds the signing keys and blobs are private
    // objects. It also covers files that others create for us (SQLite's); ours get explicit modes as well.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line on stderr: the error and its causes, joined with ": ".
            eprintln!("blobgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Help and version go out as clap formats them; usage errors become one line on stderr and exit status 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
    }
    // clap's message is the text before its usage section, sometimes over several lines: fold it into one.
    let text = e.render().to_string();
    let message: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let message = message.join(" ");
    eprintln!("blobgate: {} (see --help)", message.trim_start_matches("error: "));
    ExitCode::from(2)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = cli.settings()?;
    let serving = matches!(cli.command, Command::Serve { .. });
    let filter = blobgate::config::log_filter(if serving { &settings.log } else { "warn" })?;
    init_logging(&blobgate::config::with_quiet_sqlx(&filter), settings.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        if serving {
            let signal = shutdown_signal()?;
            let app = Application::build(settings).await?;
            app.run_until(signal).await
        } else {
            blobgate::cli::run_command(cli.command, settings).await
        }
    })
}

/// `filter` was checked by `config::log_filter`, so an unusable one never reaches here silently. JSON lines carry
/// the event's fields at the top level beside `timestamp`, `level`, `target` and `message`, and its spans.
fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(true).with_span_list(false).init(),
    }
}
