//! Thin entry point: parse the command line, load settings, start logging, dispatch.

use std::process::ExitCode;

use blobgate::cli::{Cli, Command};
use blobgate::startup::{Application, shutdown_signal};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line on stderr: the error and its causes, joined with ": ".
            eprintln!("blobgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = cli.settings()?;
    let serving = matches!(cli.command, Command::Serve { .. });
    init_logging(if serving { &settings.log } else { "warn" });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        if serving {
            let app = Application::build(settings).await?;
            app.run_until(shutdown_signal()).await
        } else {
            blobgate::cli::run_command(cli.command, settings).await
        }
    })
}

fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
}
