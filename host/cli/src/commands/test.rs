//! `keel test`: run golden batch fixtures.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use keel_cli::fixture::{self, Case};

use super::run::HostArgs;
use crate::interrupt::{Signals, Stopped};

/// Arguments of `keel test`.
#[derive(Args)]
pub struct TestArgs {
    #[command(flatten)]
    host: HostArgs,
    /// Rewrite each case's expectations with what it produced (also
    /// `KEEL_BLESS=1`).
    #[arg(long)]
    bless: bool,
    /// A fixture case, or a directory of cases.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// Run every case; print a diff for each one that differs, and fail.
pub fn run(args: &TestArgs) -> Result<()> {
    if args.host.workspace.is_some() {
        bail!("each fixture case runs in a copy of its own `workspace/`; --workspace does not apply");
    }
    if args.host.config.is_some() {
        bail!("each fixture case uses its own `keel.toml`; --config does not apply");
    }
    if args.dir.is_file() {
        bail!(
            "{} is a file; give a fixture case (a directory holding batch.json) or a directory of cases",
            args.dir.display()
        );
    }
    let cases = fixture::discover(&args.dir)?;
    if cases.is_empty() {
        bail!("no fixture cases in {} (a case is a directory holding batch.json)", args.dir.display());
    }
    let bless = args.bless || fixture::bless_requested();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // A stop signal ends the command in the case it comes in, which is
    // dropped with its calls; its workspace is a copy.
    let mut signals = {
        let _entered = runtime.enter();
        Signals::listen()?
    };
    let (mut failed, mut differed) = (Vec::new(), false);
    for case in &cases {
        let running =
            crate::progress::shown(format!("running {}", case.name), run_case(case, &args.host, bless));
        let outcome = runtime.block_on(signals.or(running));
        if let Some(stopped) = outcome.as_ref().err().and_then(crate::interrupt::stopped) {
            let signal = stopped.signal;
            return crate::interrupt::end(runtime, Err(Stopped { signal, while_starting: false }.into()));
        }
        match outcome {
            Ok(None) => outln!("ok      {}", case.name)?,
            Ok(Some(diff)) => {
                outln!("FAILED  {}\n{diff}", case.name)?;
                failed.push(&case.name);
                differed = true;
            }
            Err(error) => {
                outln!("FAILED  {}: {error:#}", case.name)?;
                failed.push(&case.name);
            }
        }
    }
    outln!("\n{} passed, {} failed", cases.len() - failed.len(), failed.len())?;
    if !failed.is_empty() {
        // Blessing takes a new output, not a case that could not run.
        if differed {
            outln!("to accept the new output: KEEL_BLESS=1 keel test {}", args.dir.display())?;
        }
        bail!("{} failed", super::counted(failed.len(), "fixture case"));
    }
    Ok(())
}

/// Run one case: `None` when it matches (or was blessed), else the diff.
async fn run_case(case: &Case, host: &HostArgs, bless: bool) -> Result<Option<String>> {
    let produced = case.run(host.builder_without_config()?).await?;
    if bless {
        case.bless(&produced)?;
        return Ok(None);
    }
    Ok(case.compare(&produced).err())
}
