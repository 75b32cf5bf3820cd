//! `fleetops-agent`: the robot's side of fleetops (the `agent` crate holds all of it).

fn main() -> std::process::ExitCode {
    fleetops_agent::main()
}
