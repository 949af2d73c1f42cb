//! Process measurements both benchmarks print: resident memory and CPU time from /proc.

/// Resident memory of a process, in MB (VmRSS now, VmHWM the peak; VmRSS is RssAnon, the
/// heap and stacks, plus RssFile, mostly the binary's own code, the same at any scale).
pub struct Memory {
    pub rss_mb: u64,
    pub hwm_mb: u64,
    pub anon_mb: u64,
    pub file_mb: u64,
}

pub fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    };
    Memory {
        rss_mb: field("VmRSS:"),
        hwm_mb: field("VmHWM:"),
        anon_mb: field("RssAnon:"),
        file_mb: field("RssFile:"),
    }
}

/// CPU time (user + system) a process has used, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command name.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    ticks as f64 / clock_ticks_per_second()
}

/// `getconf CLK_TCK`, or 100 (the value on every Linux architecture in practice).
fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}
