//! The checks a request passes before it reaches the device: flags, alignment, size and range,
//! each refusal with the error the NBD spec names and a message that says what was allowed.

use super::transmission::RequestLimits;
use crate::device::IoError;
use crate::proto::{self, Command, Request};

/// Why a request is refused without reaching the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub(crate) error: IoError,
    pub(crate) message: String,
}

/// Checks a request against the spec and the export (pure). Rules, in order: flags valid for
/// the command, command advertised, offset and length aligned to the minimum block size, length
/// within the maximum block size, range within the export (ENOSPC for writes, EINVAL otherwise).
pub(crate) fn check_request(request: &Request, limits: &RequestLimits) -> Result<(), Rejection> {
    let invalid = |message: String| Err(Rejection { error: IoError::Invalid, message });
    let allowed = allowed_flags(request.command, limits.transmission_flags);
    if request.flags & !allowed != 0 {
        return invalid(format!("flags {:#x} are not valid on {:?}; allowed: {allowed:#x}", request.flags & !allowed, request.command));
    }
    let advertised = match request.command {
        Command::Trim => limits.transmission_flags & proto::NBD_FLAG_SEND_TRIM != 0,
        Command::Flush | Command::Disc => return Ok(()), // offset and length are reserved
        _ => true,
    };
    if !advertised {
        return invalid(format!("{:?} is not supported by this export", request.command));
    }
    let block_size_bytes = u64::from(limits.block_size_bytes);
    if !request.offset.is_multiple_of(block_size_bytes) || !u64::from(request.len_bytes).is_multiple_of(block_size_bytes) {
        return invalid(format!(
            "offset {} and length {} must be multiples of the minimum block size {block_size_bytes}",
            request.offset, request.len_bytes
        ));
    }
    if request.command != Command::Trim && request.len_bytes > limits.payload_max_bytes {
        return invalid(format!("length {} exceeds the maximum block size {}", request.len_bytes, limits.payload_max_bytes));
    }
    check_range(request, limits.size_bytes)
}

fn allowed_flags(command: Command, transmission_flags: u16) -> u16 {
    let advertised = |flag: u16, command_flag: u16| {
        if transmission_flags & flag != 0 {
            command_flag
        } else {
            0
        }
    };
    // The spec: with SEND_FUA the server MUST accept FUA on every command.
    let fua = advertised(proto::NBD_FLAG_SEND_FUA, proto::NBD_CMD_FLAG_FUA);
    match command {
        Command::Read => fua | advertised(proto::NBD_FLAG_SEND_DF, proto::NBD_CMD_FLAG_DF),
        Command::WriteZeroes => fua | proto::NBD_CMD_FLAG_NO_HOLE,
        Command::Write | Command::Flush | Command::Trim | Command::Disc => fua,
    }
}

fn check_range(request: &Request, size_bytes: u64) -> Result<(), Rejection> {
    let end = request.offset.checked_add(u64::from(request.len_bytes));
    if end.is_some_and(|end| end <= size_bytes) {
        return Ok(());
    }
    let error = match request.command {
        Command::Write | Command::WriteZeroes => IoError::NoSpace,
        _ => IoError::Invalid,
    };
    let message = format!(
        "{:?} of {} bytes at offset {} ends past the export size of {size_bytes} bytes",
        request.command, request.len_bytes, request.offset
    );
    Err(Rejection { error, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE_BYTES: u64 = 1 << 20;

    fn limits(transmission_flags: u16) -> RequestLimits {
        RequestLimits { size_bytes: SIZE_BYTES, block_size_bytes: 512, payload_max_bytes: proto::PAYLOAD_MAX_BYTES, transmission_flags }
    }

    const ALL: u16 = proto::NBD_FLAG_HAS_FLAGS
        | proto::NBD_FLAG_SEND_FLUSH
        | proto::NBD_FLAG_SEND_FUA
        | proto::NBD_FLAG_SEND_TRIM
        | proto::NBD_FLAG_SEND_WRITE_ZEROES
        | proto::NBD_FLAG_SEND_DF;

    /// Checks one request against an export of 1 MiB with 512-byte blocks; `expected` is
    /// `None` for acceptance or the error it must be refused with.
    fn check(command: Command, flags: u16, offset: u64, len_bytes: u32, transmission_flags: u16, expected: Option<IoError>) {
        let request = Request { flags, command, cookie: 1, offset, len_bytes };
        let actual = check_request(&request, &limits(transmission_flags)).map_err(|rejection| rejection.error);
        assert_eq!(actual.err(), expected, "{request:?}");
    }

    #[test]
    fn well_formed_requests_pass() {
        check(Command::Read, 0, 0, 4096, ALL, None);
        check(Command::Write, proto::NBD_CMD_FLAG_FUA, SIZE_BYTES - 512, 512, ALL, None);
        check(Command::Read, proto::NBD_CMD_FLAG_DF, 512, 512, ALL, None);
        check(Command::WriteZeroes, proto::NBD_CMD_FLAG_NO_HOLE | proto::NBD_CMD_FLAG_FUA, 0, 1024, ALL, None);
        check(Command::Trim, 0, 0, 512, ALL, None);
        check(Command::Flush, 0, 7, 3, ALL, None); // offset and length of a flush are reserved
    }

    #[test]
    fn misaligned_requests_are_invalid() {
        check(Command::Read, 0, 1, 512, ALL, Some(IoError::Invalid));
        check(Command::Write, 0, 0, 511, ALL, Some(IoError::Invalid));
        check(Command::Trim, 0, 256, 512, ALL, Some(IoError::Invalid));
        check(Command::WriteZeroes, 0, 0, 100, ALL, Some(IoError::Invalid));
    }

    #[test]
    fn past_the_end_is_enospc_for_writes_and_einval_otherwise() {
        check(Command::Write, 0, SIZE_BYTES, 512, ALL, Some(IoError::NoSpace));
        check(Command::WriteZeroes, 0, SIZE_BYTES - 512, 1024, ALL, Some(IoError::NoSpace));
        check(Command::Read, 0, SIZE_BYTES - 512, 1024, ALL, Some(IoError::Invalid));
        check(Command::Trim, 0, SIZE_BYTES, 512, ALL, Some(IoError::Invalid));
        // An offset near u64::MAX must not wrap around into range.
        check(Command::Read, 0, u64::MAX - 511, 512, ALL, Some(IoError::Invalid));
    }

    #[test]
    fn flags_and_commands_must_be_advertised() {
        check(Command::Read, proto::NBD_CMD_FLAG_DF, 0, 512, ALL & !proto::NBD_FLAG_SEND_DF, Some(IoError::Invalid));
        check(Command::Write, proto::NBD_CMD_FLAG_NO_HOLE, 0, 512, ALL, Some(IoError::Invalid));
        check(Command::WriteZeroes, proto::NBD_CMD_FLAG_FAST_ZERO, 0, 512, ALL, Some(IoError::Invalid));
        check(Command::Read, 1 << 9, 0, 512, ALL, Some(IoError::Invalid));
        check(Command::Trim, 0, 0, 512, ALL & !proto::NBD_FLAG_SEND_TRIM, Some(IoError::Invalid));
        check(Command::Flush, proto::NBD_CMD_FLAG_FUA, 0, 0, ALL, None);
    }

    #[test]
    fn oversized_lengths_are_invalid_except_for_trim() {
        let big_limits = RequestLimits { size_bytes: 1 << 40, ..limits(ALL) };
        let over = proto::PAYLOAD_MAX_BYTES + 512;
        for (command, expected) in [
            (Command::Read, Some(IoError::Invalid)),
            (Command::Write, Some(IoError::Invalid)),
            (Command::WriteZeroes, Some(IoError::Invalid)),
            (Command::Trim, None),
        ] {
            let request = Request { flags: 0, command, cookie: 1, offset: 0, len_bytes: over };
            let actual = check_request(&request, &big_limits).map_err(|rejection| rejection.error);
            assert_eq!(actual.err(), expected, "{command:?}");
        }
    }

    #[test]
    fn rejections_explain_themselves() {
        let request = Request { flags: 0, command: Command::Write, cookie: 1, offset: SIZE_BYTES, len_bytes: 512 };
        let rejection = check_request(&request, &limits(ALL)).unwrap_err();
        assert_eq!(rejection.message, "Write of 512 bytes at offset 1048576 ends past the export size of 1048576 bytes");
    }
}
