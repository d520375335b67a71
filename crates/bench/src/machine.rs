//! What machine a run measured on, from /proc: enough to tell two reports' machines apart.

use crate::results::Machine;

impl Machine {
    /// Reads this machine's description; fields that cannot be read are left empty.
    pub fn detect() -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, model)| model.trim().to_string()))
            .unwrap_or_default();
        let memory_bytes = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024);
        Machine {
            hostname: read("/proc/sys/kernel/hostname"),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            cpu_model,
            kernel: format!("{} {}", read("/proc/sys/kernel/ostype"), read("/proc/sys/kernel/osrelease")).trim().to_string(),
            memory_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_is_described() {
        let machine = Machine::detect();
        assert!(machine.cores >= 1);
        assert!(machine.kernel.starts_with("Linux"), "{machine:?}");
        assert!(machine.memory_bytes > 0, "{machine:?}");
    }
}
