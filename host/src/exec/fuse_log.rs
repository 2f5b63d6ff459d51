//! What a FUSE program's log says about why it did not mount.
//!
//! When a FUSE program exits before mounting (or never mounts), the error the CSI caller sees
//! quotes its log. The last lines alone are often useless: `weed mount` prints its cause and
//! then ~150 lines of usage text, so the tail is the usage text. [`summary`] picks the lines
//! that say what went wrong — error-looking lines before any usage dump, or the lines just
//! before it — plus the last line or two, bounded in size. Pure: text in, text out.

/// How much of the end of a log file the host reads for [`summary`].
pub const TAIL_BYTES: u64 = 64 << 10;

/// At most this many cause lines are quoted (the latest ones).
const MAX_CAUSES: usize = 5;
/// Lines of the log's end quoted besides the causes.
const LAST_LINES: usize = 2;
/// Each quoted line is cut to this many characters.
const MAX_LINE: usize = 300;
/// The whole summary is cut to this many characters.
const MAX_SUMMARY: usize = 2000;

/// Words that mark a line as saying what went wrong (matched case-insensitively).
const ERROR_WORDS: &[&str] = &[
    "error",
    "invalid",
    "fail",
    "fatal",
    "panic",
    "refused",
    "denied",
    "not permitted",
    "no such",
    "cannot",
    "unable",
];

/// The lines of `log` that say what went wrong, then its last line or two, joined with ` | `.
/// Lines inside a usage dump (`Usage:`, `Usage of ...:`, weed's `Example:` + `Default Usage:`,
/// up to the next line that looks like a program's own output again) are never quoted; a dump
/// at the end is mentioned by its length instead. Without any error-looking line, the lines
/// just before that dump (or the last lines) are the best guess.
pub fn summary(log: &str) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return "(empty log)".into();
    }
    let usage = usage_lines(&lines);
    let outside: Vec<usize> = (0..lines.len()).filter(|&i| !usage[i]).collect();

    let mut picked: Vec<usize> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for &i in outside.iter().rev() {
        if picked.len() == MAX_CAUSES {
            break;
        }
        // A retry loop repeats one cause with new timestamps: quote its latest occurrence once.
        let key = without_glog_header(lines[i]);
        if looks_like_error(lines[i]) && !seen.contains(&key) {
            seen.push(key);
            picked.push(i);
        }
    }
    // The log's last lines (outside usage text): where the program stopped, or, with no
    // error-looking line at all, the best guess at why.
    picked.extend(outside.iter().rev().take(LAST_LINES));
    picked.sort_unstable();
    picked.dedup();

    let mut parts: Vec<String> = Vec::new();
    let mut previous: Option<usize> = None;
    for i in picked {
        if previous.is_some_and(|p| outside.iter().any(|&o| o > p && o < i)) {
            parts.push("…".into());
        }
        parts.push(clean(lines[i]));
        previous = Some(i);
    }
    let trailing_usage = usage.iter().rev().take_while(|u| **u).count();
    if trailing_usage > 0 {
        parts.push(format!("(then {trailing_usage} lines of usage text)"));
    }
    cut(&parts.join(" | "), MAX_SUMMARY)
}

/// Which lines belong to a usage dump: from a usage header (with weed's `Example:` line right
/// before it) up to the next unindented line that is a glog line or looks like an error, which
/// is the program (or a later run of it) talking again.
fn usage_lines(lines: &[&str]) -> Vec<bool> {
    let is_header = |l: &str| {
        let l = l.trim_start().to_ascii_lowercase();
        l.starts_with("usage:") || l.starts_with("usage of ") || l.starts_with("default usage:")
    };
    let mut usage = vec![false; lines.len()];
    let mut inside = false;
    for (i, line) in lines.iter().enumerate() {
        if is_header(line) {
            inside = true;
            if i > 0 && lines[i - 1].trim_start().starts_with("Example:") {
                usage[i - 1] = true;
            }
        } else if inside && !line.starts_with([' ', '\t']) && (is_glog(line) || looks_like_error(line)) {
            inside = false;
        }
        usage[i] = inside;
    }
    usage
}

/// A glog line: severity letter, `MMDD`, a space.
fn is_glog(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 5 && matches!(b[0], b'I' | b'W' | b'E' | b'F') && b[1..5].iter().all(u8::is_ascii_digit) && b[5] == b' '
}

/// A glog `E`/`F` line, or a line with one of [`ERROR_WORDS`].
fn looks_like_error(line: &str) -> bool {
    if is_glog(line) && matches!(line.as_bytes()[0], b'E' | b'F') {
        return true;
    }
    let lower = line.to_lowercase();
    ERROR_WORDS.iter().any(|w| lower.contains(w))
}

/// `I1201 03:19:37.777590 filer_client.go:271 text` → `filer_client.go:271 text`; other lines as they are.
fn without_glog_header(line: &str) -> &str {
    if !is_glog(line) {
        return line;
    }
    // Skip the severity+date and the time fields.
    line.splitn(3, ' ').nth(2).map(str::trim_start).unwrap_or(line)
}

/// One line as quoted: control characters replaced, cut to [`MAX_LINE`].
fn clean(line: &str) -> String {
    let line: String = line.trim().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    cut(&line, MAX_LINE)
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// What the end of a log (its last [`TAIL_BYTES`]) says went wrong, for error messages: see
/// [`summary`]. Read through the descriptor the executor opened the log with (below the state
/// directory, without following links), never by its name again. The caller scrubs secrets.
pub fn tail_of(log: &std::fs::File) -> String {
    use std::os::unix::fs::FileExt;
    let len = log.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(TAIL_BYTES);
    let mut buf = vec![0; (len - start) as usize];
    let mut done = 0;
    while done < buf.len() {
        match log.read_at(&mut buf[done..], start + done as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => done += n,
        }
    }
    buf.truncate(done);
    let text = String::from_utf8_lossy(&buf);
    // A tail that starts mid-file starts mid-line: drop that fragment.
    let text = if start > 0 { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
    summary(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log of `weed mount -filer.path=/buckets/v1` (SeaweedFS 4.48) against a filer that has
    /// no `/buckets` yet: the cause, then the usage text (shortened here; the real one is 150
    /// lines). Paths and inode numbers shortened.
    const WEED_INVALID_BUCKET: &str = "\
mount point owner uid=0 gid=0 mode=drwxr-xr-x
current uid=0 gid=0
I1201 03:19:37.742882 leveldb_store.go:48 filer store dir: /var/lib/mounthost/cache/volumes/k/285ea5e8/meta
I1201 03:19:37.742908 file_util.go:29 Folder /var/lib/mounthost/cache/volumes/k/285ea5e8/meta Permission: -rwxr-xr-x
I1201 03:19:37.777590 filer_client.go:271 mkdir directory:\"/buckets\"  entry:{name:\"v1\"  is_directory:true  attributes:{mtime:1796095177  file_mode:2147484159  crtime:1796095177}}: CreateEntry: invalid bucket name v1: bucket name must between [3, 63] characters
failed to create dir /buckets/v1 on filer [127.0.0.1:18888]: mkdir /buckets/v1: CreateEntry: invalid bucket name v1: bucket name must between [3, 63] characters

Example: weed mount -filer=localhost:8888 -dir=/some/dir
Default Usage:
  -allowOthers
    \tallows other users to access the file system (default true)
  -asyncDio
    \tenable async direct I/O for better concurrency
  -readRetryTime duration
    \tmaximum read retry wait time (default 6s)
Description:
  mount weed filer to userspace.

  Pre-requisites:
  1) have SeaweedFS master and volume servers running
  including what Linux and FreeBSD show for the mount in \"mount\" and \"df\".
";

    /// `weed mount` against a filer that is not there: it retries forever.
    const WEED_NO_FILER: &str = "\
mount point owner uid=0 gid=0 mode=drwxr-xr-x
current uid=0 gid=0
I1201 03:24:57.720401 mount_common.go:161 failed to talk to filer [127.0.0.1:1]: get filer grpc address [127.0.0.1:1] configuration: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:10001: connect: connection refused\"
I1201 03:24:57.720475 mount_common.go:162 wait for 1 seconds ...
I1201 03:24:58.721358 mount_common.go:161 failed to talk to filer [127.0.0.1:1]: get filer grpc address [127.0.0.1:1] configuration: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:10001: connect: connection refused\"
I1201 03:24:58.721381 mount_common.go:162 wait for 2 seconds ...
";

    #[test]
    fn the_cause_before_a_usage_dump_is_quoted_and_the_usage_is_not() {
        let s = summary(WEED_INVALID_BUCKET);
        assert!(
            s.contains(
                "failed to create dir /buckets/v1 on filer [127.0.0.1:18888]: mkdir /buckets/v1: CreateEntry: \
                 invalid bucket name v1: bucket name must between [3, 63] characters"
            ),
            "{s}"
        );
        assert!(s.contains("filer_client.go:271"), "{s}");
        assert!(!s.contains("allowOthers") && !s.contains("df"), "no usage text: {s}");
        assert!(s.ends_with("(then 13 lines of usage text)"), "{s}");
        assert!(!s.contains("leveldb_store"), "only the lines that say what went wrong: {s}");
    }

    #[test]
    fn a_retry_loop_is_quoted_once_with_the_last_lines() {
        let s = summary(WEED_NO_FILER);
        assert_eq!(s.matches("failed to talk to filer").count(), 1, "{s}");
        assert!(s.contains("connection refused"), "{s}");
        assert!(s.contains("03:24:58.721358"), "the latest occurrence: {s}");
        assert!(s.ends_with("wait for 2 seconds ..."), "ends with the log's last line: {s}");
    }

    #[test]
    fn glog_errors_and_fatals_count_as_causes() {
        let log = "I0101 00:00:00.000000 a.go:1 starting\n\
                   E0101 00:00:00.000001 b.go:2 the mount point is busy\n\
                   I0101 00:00:00.000002 a.go:3 step one\n\
                   I0101 00:00:00.000003 a.go:4 step two\n\
                   I0101 00:00:00.000004 a.go:5 step three\n";
        let s = summary(log);
        assert!(s.starts_with("E0101 00:00:00.000001 b.go:2 the mount point is busy | … | "), "{s}");
        assert!(s.ends_with("step three"), "{s}");
        assert!(!s.contains("starting") && !s.contains("step one"), "{s}");
    }

    #[test]
    fn without_error_lines_the_lines_before_the_usage_are_quoted() {
        let log = "one\ntwo\nthree\nUsage: prog [options] DIR\n  -x  a flag\n";
        assert_eq!(summary(log), "two | three | (then 2 lines of usage text)");
    }

    #[test]
    fn usage_text_counts_from_its_last_dump_only() {
        // A log appended by two runs: the first run's usage text is not the second run's.
        let log = "run one failed\nUsage: prog\n  -x\nrun two started\npanic: runtime error: index out of range\n\
                   goroutine 1 [running]:\nmain.main()\n\t/src/main.go:10 +0x1d\n";
        let s = summary(log);
        assert!(s.contains("panic: runtime error"), "{s}");
        assert!(s.contains("run one failed"), "an earlier cause stays a cause: {s}");
        assert!(s.ends_with("/src/main.go:10 +0x1d"), "{s}");
    }

    #[test]
    fn output_is_bounded() {
        let long = format!("error: {}", "x".repeat(10_000));
        let fatals: String = (0..50).map(|i| format!("fatal {i}\n")).collect();
        let s = summary(&format!("{long}\n{fatals}"));
        assert!(s.chars().count() <= MAX_SUMMARY, "{}", s.len());
        assert_eq!(s.matches("fatal").count(), MAX_CAUSES, "the latest causes: {s}");
        assert!(s.ends_with("fatal 49"), "{s}");
        let s = summary(&long);
        assert_eq!(s.chars().count(), MAX_LINE, "one long line is cut");
        assert_eq!(summary(""), "(empty log)");
        assert_eq!(summary("\n \n"), "(empty log)");
    }

    #[test]
    fn control_characters_are_not_quoted() {
        let s = summary("fatal: \x1b[31mred\x1b[0m\r\n");
        assert!(!s.chars().any(char::is_control), "{s:?}");
    }
}
