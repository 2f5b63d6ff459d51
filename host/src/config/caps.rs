//! Caps every volume's cgroup gets from host config, whatever its plan says: processes and
//! block I/O. Data only; `exec::cgroup` writes them.

/// Caps every volume's group gets, whatever its plan says (host config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caps {
    /// `pids.max`: processes and threads of the group together.
    pub pids: Option<u64>,
    /// Block I/O throttling, one entry per device.
    pub io: Vec<IoLimit>,
}

/// Block I/O throttling of one device (`MAJ:MIN`, as `/sys/dev/block` names it): bytes and
/// operations per second, read and write; a field left out is not throttled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoLimit {
    pub major: u32,
    pub minor: u32,
    pub rbps: Option<u64>,
    pub wbps: Option<u64>,
    pub riops: Option<u64>,
    pub wiops: Option<u64>,
}

impl IoLimit {
    /// `MAJ:MIN KEY=N...` with KEY one of `rbps`, `wbps`, `riops`, `wiops` (each at most once,
    /// N a positive integer), as v2's `io.max` takes it.
    pub fn parse(s: &str) -> Result<IoLimit, String> {
        let usage =
            "expected MAJ:MIN KEY=N..., KEY one of rbps, wbps, riops, wiops (e.g. \"8:0 wbps=104857600 wiops=1000\")";
        let mut words = s.split_whitespace();
        let device = words.next().ok_or_else(|| format!("{s:?}: {usage}"))?;
        let (major, minor) = device
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
            .ok_or_else(|| format!("{s:?}: device {device:?} is not MAJ:MIN; {usage}"))?;
        let mut limit = IoLimit { major, minor, ..IoLimit::default() };
        for word in words {
            let (key, value) = word.split_once('=').ok_or_else(|| format!("{s:?}: {word:?} is not KEY=N; {usage}"))?;
            let n = value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{s:?}: {key}={value:?} is not a positive integer"))?;
            let field = match key {
                "rbps" => &mut limit.rbps,
                "wbps" => &mut limit.wbps,
                "riops" => &mut limit.riops,
                "wiops" => &mut limit.wiops,
                _ => return Err(format!("{s:?}: unknown key {key:?}; {usage}")),
            };
            if field.replace(n).is_some() {
                return Err(format!("{s:?}: {key} is given twice"));
            }
        }
        if limit.fields().iter().all(|(_, v)| v.is_none()) {
            return Err(format!("{s:?}: no limit given; {usage}"));
        }
        Ok(limit)
    }

    /// The device, `MAJ:MIN`.
    pub fn device(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }

    fn fields(&self) -> [(&'static str, Option<u64>); 4] {
        [("rbps", self.rbps), ("wbps", self.wbps), ("riops", self.riops), ("wiops", self.wiops)]
    }

    /// The line v2's `io.max` takes (fields left out are `max`).
    pub fn v2_line(&self) -> String {
        let mut line = self.device();
        for (key, value) in self.fields() {
            line.push_str(&format!(" {key}={}", value.map_or("max".to_string(), |v| v.to_string())));
        }
        line
    }

    /// v1's throttle files and what each gets (`MAJ:MIN N`; `0` clears a rule).
    pub fn v1_writes(&self) -> [(&'static str, String); 4] {
        let line = |v: Option<u64>| format!("{} {}", self.device(), v.unwrap_or(0));
        [
            ("blkio.throttle.read_bps_device", line(self.rbps)),
            ("blkio.throttle.write_bps_device", line(self.wbps)),
            ("blkio.throttle.read_iops_device", line(self.riops)),
            ("blkio.throttle.write_iops_device", line(self.wiops)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_limit_is_a_device_and_positive_fields() {
        let l = IoLimit::parse("253:0 wbps=1048576 riops=100").unwrap();
        assert_eq!(
            (l.major, l.minor, l.wbps, l.riops, l.rbps, l.wiops),
            (253, 0, Some(1 << 20), Some(100), None, None)
        );
        assert_eq!(l.v2_line(), "253:0 rbps=max wbps=1048576 riops=100 wiops=max");
        assert_eq!(
            l.v1_writes().map(|(f, v)| format!("{f}={v}")),
            [
                "blkio.throttle.read_bps_device=253:0 0",
                "blkio.throttle.write_bps_device=253:0 1048576",
                "blkio.throttle.read_iops_device=253:0 100",
                "blkio.throttle.write_iops_device=253:0 0",
            ]
        );
        for (bad, says) in [
            ("", "expected MAJ:MIN"),
            ("8:0", "no limit given"),
            ("sda wbps=1", "is not MAJ:MIN"),
            ("8:x wbps=1", "is not MAJ:MIN"),
            ("8:0 wbps", "is not KEY=N"),
            ("8:0 wbps=0", "not a positive integer"),
            ("8:0 wbps=-1", "not a positive integer"),
            ("8:0 wbps=max", "not a positive integer"),
            ("8:0 bps=1", "unknown key \"bps\""),
            ("8:0 wbps=1 wbps=2", "wbps is given twice"),
        ] {
            let err = IoLimit::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }
}
