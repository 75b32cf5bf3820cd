//! fleetops-agent: the robot's side of fleetops, one small binary.
//!
//! - `fleetops-agent [--config FILE] enroll`: registers this robot with its project's
//!   enrollment token and keeps the device token it gets (`identity`).
//! - `fleetops-agent [--config FILE] daemon`: heartbeats with metrics (`daemon`, `metrics`),
//!   and the robot's updates when an install hook is configured (`update`).
//! - `fleetops-agent [--config FILE] run [--tag T]... -- CMD ARGS`: a session around one run
//!   of a command, its output shipped as logs, its recordings uploaded (`run`, `spool`).
//!
//! Every call to the service goes through `client` (backoff with jitter, `Retry-After`,
//! TLS with the system's roots and an optional CA); nothing the service answers panics the
//! agent. The configuration is `config` (docs/agent.md has every key).

pub mod client;
pub mod config;
pub mod daemon;
pub mod files;
pub mod follow;
pub mod identity;
pub mod lines;
pub mod metrics;
pub mod run;
pub mod spool;
pub mod update;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: fleetops-agent [--config FILE] enroll
       fleetops-agent [--config FILE] daemon
       fleetops-agent [--config FILE] run [--tag TAG]... -- COMMAND [ARGS]...
       fleetops-agent --version";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Command {
    Enroll,
    Daemon,
    Run { tags: Vec<String>, cmd: Vec<String> },
}

/// Parses the arguments after the program's name: the configuration file and the command.
pub fn parse(args: &[String]) -> Result<(PathBuf, Command), String> {
    let mut config = PathBuf::from("/etc/fleetops-agent.toml");
    let mut i = 0;
    while i < args.len() && args[i] == "--config" {
        config = PathBuf::from(args.get(i + 1).ok_or("--config needs a file")?);
        i += 2;
    }
    let cmd = match args.get(i).map(String::as_str) {
        Some("enroll") if i + 1 == args.len() => Command::Enroll,
        Some("daemon") if i + 1 == args.len() => Command::Daemon,
        Some("run") => {
            let mut tags = Vec::new();
            let mut j = i + 1;
            loop {
                match args.get(j).map(String::as_str) {
                    Some("--tag") => {
                        tags.push(args.get(j + 1).ok_or("--tag needs a value")?.clone());
                        j += 2;
                    }
                    Some("--") => {
                        j += 1;
                        break;
                    }
                    _ => return Err("run: put the command after --".into()),
                }
            }
            let cmd: Vec<String> = args[j..].to_vec();
            if cmd.is_empty() {
                return Err("run: no command given after --".into());
            }
            Command::Run { tags, cmd }
        }
        _ => return Err(USAGE.into()),
    };
    Ok((config, cmd))
}

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Before the command's `--`, these are the agent's own.
    let own = args.iter().take_while(|a| *a != "--");
    for a in own {
        if a == "--help" || a == "-h" {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        if a == "--version" || a == "-V" {
            println!("fleetops-agent {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
    }
    let (path, cmd) = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fleetops-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match config::Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleetops-agent: {e}");
            return ExitCode::from(2);
        }
    };
    // One thread: a robot's computer has other work to do.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleetops-agent: {e}");
            return ExitCode::from(1);
        }
    };
    let out = rt.block_on(async {
        match cmd {
            Command::Enroll => {
                let http = client::http_client(&cfg)?;
                identity::load_or_enroll(&cfg, &http).await.map(|_| 0)
            }
            Command::Daemon => daemon::daemon(&cfg).await,
            Command::Run { tags, cmd } => run::run(&cfg, tags, cmd).await,
        }
    });
    match out {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("fleetops-agent: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_command_line_names_the_config_and_the_command() {
        assert_eq!(
            parse(&args(&[
                "--config", "a.toml", "run", "--tag", "t1", "--", "ls", "-l"
            ])),
            Ok((
                PathBuf::from("a.toml"),
                Command::Run {
                    tags: vec!["t1".into()],
                    cmd: vec!["ls".into(), "-l".into()]
                }
            ))
        );
        assert_eq!(
            parse(&args(&["daemon"])),
            Ok((PathBuf::from("/etc/fleetops-agent.toml"), Command::Daemon))
        );
        assert!(parse(&args(&["run", "ls"])).is_err());
        assert!(parse(&args(&["run", "--"])).is_err());
        assert!(parse(&args(&["dance"])).is_err());
    }
}
