//! `mounthost lazyfs`: the lazy model volumes' FUSE server ([`crate::lazyfs`]), as the host
//! daemon starts it: `mounthost lazyfs --fuse /dev/fd/3 --control /dev/fd/4`.

use std::io;

use clap::Args;

/// The descriptors the host daemon hands the server.
#[derive(Debug, Args)]
pub struct LazyfsArgs {
    /// The mounted FUSE connection, as `/dev/fd/N`.
    #[arg(long)]
    pub fuse: String,
    /// The listening control socket, as `/dev/fd/N`.
    #[arg(long)]
    pub control: String,
}

/// Serve until the connection ends.
pub fn run(args: &LazyfsArgs) -> io::Result<()> {
    let fuse = crate::unpriv::sys::take_inherited(fd_number(&args.fuse)?)?;
    let control = crate::unpriv::sys::take_inherited(fd_number(&args.control)?)?;
    crate::lazyfs::serve(fuse, control)
}

/// `N` of `/dev/fd/N`.
fn fd_number(arg: &str) -> io::Result<i32> {
    arg.strip_prefix("/dev/fd/")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{arg:?} is not a descriptor as /dev/fd/N")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_named_as_dev_fd() {
        assert_eq!(fd_number("/dev/fd/3").unwrap(), 3);
        assert!(fd_number("3").is_err());
        assert!(fd_number("/dev/fd/x").is_err());
    }
}
