//! Sizes asked for by the expansion RPCs: the CSI capacity range checked, and a plugin's
//! answer held against it. Shared by the front (ControllerExpandVolume) and the daemon
//! (NodeExpandVolume); nothing here has effects.

use crate::error::{Error, ErrorKind};
use crate::proto::csi;

/// The CSI capacity range, checked: `(required, limit)` in bytes, 0 for unspecified; at least
/// one of them set.
pub fn expansion_range(range: Option<&csi::CapacityRange>) -> Result<(u64, u64), Error> {
    let range = range.ok_or_else(|| Error::invalid("capacity_range is required: the size to expand the volume to"))?;
    let (required, limit) = (range.required_bytes, range.limit_bytes);
    if required < 0 || limit < 0 || (limit > 0 && required > limit) {
        return Err(Error::invalid(format!("capacity_range is invalid: required {required}, limit {limit}")));
    }
    if required == 0 && limit == 0 {
        return Err(Error::invalid("capacity_range names no size: set required_bytes (or limit_bytes)"));
    }
    Ok((required as u64, limit as u64))
}

/// NodeExpandVolume's capacity range, checked: optional there (CSI: "If capacity_range is
/// omitted then a plugin MAY inspect the file system of the volume to determine the maximum
/// capacity to which the volume can be expanded"), so none, or one naming no size, is `(0, 0)`:
/// the size the controller gave the volume.
pub fn node_expansion_range(range: Option<&csi::CapacityRange>) -> Result<(u64, u64), Error> {
    match range {
        None => Ok((0, 0)),
        Some(r) if r.required_bytes == 0 && r.limit_bytes == 0 => Ok((0, 0)),
        Some(_) => expansion_range(range),
    }
}

/// A plugin's expansion answer against the range asked for: more than `limit` is OUT_OF_RANGE,
/// less than `required` a plugin bug.
pub fn fits(plugin: &str, capacity: u64, required: u64, limit: u64) -> Result<(), Error> {
    if limit > 0 && capacity > limit {
        return Err(Error::new(
            ErrorKind::OutOfRange,
            format!(
                "plugin {plugin} would give the volume {capacity} bytes, more than capacity_range.limit_bytes {limit}"
            ),
        ));
    }
    if capacity < required {
        return Err(Error::internal(format!(
            "plugin {plugin} answered the expansion to {required} bytes with a capacity of {capacity} bytes (a plugin bug)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_answers_are_checked() {
        let range = |required, limit| Some(csi::CapacityRange { required_bytes: required, limit_bytes: limit });
        assert_eq!(expansion_range(range(2 << 30, 0).as_ref()).unwrap(), (2 << 30, 0));
        assert_eq!(expansion_range(range(0, 4 << 30).as_ref()).unwrap(), (0, 4 << 30));
        for (r, l) in [(0, 0), (-1, 0), (0, -1), (5, 4)] {
            assert_eq!(expansion_range(range(r, l).as_ref()).unwrap_err().kind, ErrorKind::InvalidArgument, "{r} {l}");
        }
        assert_eq!(expansion_range(None).unwrap_err().kind, ErrorKind::InvalidArgument);
        // Optional on the node.
        assert_eq!(node_expansion_range(None).unwrap(), (0, 0));
        assert_eq!(node_expansion_range(range(0, 0).as_ref()).unwrap(), (0, 0));
        assert_eq!(node_expansion_range(range(2 << 30, 0).as_ref()).unwrap(), (2 << 30, 0));
        for (r, l) in [(-1, 0), (0, -1), (5, 4)] {
            let e = node_expansion_range(range(r, l).as_ref()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{r} {l}");
        }
        fits("p", 2 << 30, 2 << 30, 0).unwrap();
        fits("p", 3 << 30, 2 << 30, 3 << 30).unwrap();
        assert_eq!(fits("p", 4 << 30, 2 << 30, 3 << 30).unwrap_err().kind, ErrorKind::OutOfRange);
        assert_eq!(fits("p", 1 << 30, 2 << 30, 0).unwrap_err().kind, ErrorKind::Internal);
    }
}
