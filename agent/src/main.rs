//! `tessera-agent`: runs on each GPU host. This build discovers the host's GPUs and prints
//! them (`tessera-agent probe`); see the crate docs of `tessera_agent`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use tessera_agent::probe::{GpuProbe, NvmlProbe, SimulatedProbe};

#[derive(Parser)]
#[command(name = "tessera-agent", version, about = "Tessera host agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Discover this host's GPUs and print them as JSON.
    Probe {
        /// Simulate GPUs instead of asking NVML, e.g. `8xH100-80GB`.
        #[arg(long, env = "TESSERA_AGENT_SIMULATE")]
        simulate: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let Command::Probe { simulate } = Cli::parse().command;
    let inventory = match simulate {
        Some(spec) => SimulatedProbe::parse(&spec, "local")?.inventory()?,
        None => NvmlProbe::new()?.inventory()?,
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&inventory).context("encoding the inventory")?
    );
    Ok(())
}
