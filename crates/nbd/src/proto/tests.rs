use super::*;

/// Compares a parse result with what the test expects, printing both on mismatch.
fn check<T: PartialEq + fmt::Debug>(actual: Result<T, ProtoError>, expected: Result<T, ProtoError>) {
    assert_eq!(actual, expected);
}

fn short(what: &'static str, needed_bytes: usize, got_bytes: usize) -> ProtoError {
    ProtoError::Short { what, needed_bytes, got_bytes }
}

#[test]
fn greeting_round_trips_and_rejects_bad_input() {
    let greeting = encode_greeting(SERVER_HANDSHAKE_FLAGS);
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    assert_eq!(&greeting[8..16], b"IHAVEOPT");
    assert_eq!(&greeting[16..], &[0, 3]);
    check(parse_greeting(&greeting), Ok(3));
    check(parse_greeting(&greeting[..17]), Err(short("greeting", 18, 17)));
    let mut bad = greeting;
    bad[0] = b'X';
    check(parse_greeting(&bad), Err(ProtoError::BadMagic { what: "greeting NBDMAGIC", expected: NBD_MAGIC, got: 0x5842_444d_4147_4943 }));
    check(parse_greeting(&encode_greeting(0)), Err(ProtoError::NotFixedNewstyle { handshake_flags: 0 }));
}

#[test]
fn client_flags_accept_only_what_was_offered() {
    let both = ClientFlags { fixed_newstyle: true, no_zeroes: true };
    check(parse_client_flags(&[0, 0, 0, 3], SERVER_HANDSHAKE_FLAGS), Ok(both));
    check(parse_client_flags(&encode_client_flags(both), SERVER_HANDSHAKE_FLAGS), Ok(both));
    let none = ClientFlags { fixed_newstyle: false, no_zeroes: false };
    check(parse_client_flags(&[0, 0, 0, 0], SERVER_HANDSHAKE_FLAGS), Ok(none));
    check(parse_client_flags(&[0, 0, 0, 4], SERVER_HANDSHAKE_FLAGS), Err(ProtoError::UnknownClientFlags { flags: 4 }));
    // NO_ZEROES is an error when the server did not offer it.
    check(parse_client_flags(&[0, 0, 0, 3], NBD_FLAG_FIXED_NEWSTYLE), Err(ProtoError::UnknownClientFlags { flags: 3 }));
    check(parse_client_flags(&[0, 0, 3], SERVER_HANDSHAKE_FLAGS), Err(short("client flags", 4, 3)));
}

#[test]
fn option_header_parses_and_rejects_oversized_lengths() {
    let go = encode_option(NBD_OPT_GO, &[0; 6]);
    check(parse_option_header(&go[..16]), Ok(OptionHeader { option: NBD_OPT_GO, len_bytes: 6 }));
    check(parse_option_header(&go[..15]), Err(short("option header", 16, 15)));
    let mut oversized = encode_option(NBD_OPT_GO, &[]);
    oversized[12..16].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
    check(
        parse_option_header(&oversized),
        Err(ProtoError::OptionTooLong { option: NBD_OPT_GO, len_bytes: 0xffff_fff0, max_bytes: OPTION_DATA_MAX_BYTES }),
    );
    let mut bad_magic = go.clone();
    bad_magic[0] = 0;
    check(
        parse_option_header(&bad_magic),
        Err(ProtoError::BadMagic { what: "option IHAVEOPT", expected: NBD_OPTS_MAGIC, got: 0x0048_4156_454f_5054 }),
    );
}

#[test]
fn options_parse_into_what_the_server_acts_on() {
    let request = InfoRequest { export_name: "vd0".into(), info_types: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME] };
    let data = encode_info_request(&request);
    assert_eq!(data, [0, 0, 0, 3, b'v', b'd', b'0', 0, 2, 0, 3, 0, 1]);
    check(parse_option(NBD_OPT_GO, &data), Ok(ClientOption::Go(request.clone())));
    check(parse_option(NBD_OPT_INFO, &data), Ok(ClientOption::Info(request)));
    check(parse_option(NBD_OPT_EXPORT_NAME, b"vd1"), Ok(ClientOption::ExportName { export_name: "vd1".into() }));
    check(parse_option(NBD_OPT_ABORT, b"ignored"), Ok(ClientOption::Abort));
    check(parse_option(NBD_OPT_LIST, &[]), Ok(ClientOption::List));
    check(parse_option(NBD_OPT_STRUCTURED_REPLY, &[]), Ok(ClientOption::StructuredReply));
    check(parse_option(NBD_OPT_STARTTLS, &[]), Ok(ClientOption::StartTls));
    check(
        parse_option(NBD_OPT_STARTTLS, &[0]),
        Err(ProtoError::InvalidOption { option: NBD_OPT_STARTTLS, reason: "expected no data, got 1 bytes".into() }),
    );
    check(parse_option(NBD_OPT_SET_META_CONTEXT, &[1, 2, 3]), Ok(ClientOption::Unsupported { option: NBD_OPT_SET_META_CONTEXT }));
}

#[test]
fn malformed_options_are_invalid_not_panics() {
    let invalid = |option, reason: &str| Err(ProtoError::InvalidOption { option, reason: reason.into() });
    check(parse_option(NBD_OPT_LIST, &[0]), invalid(NBD_OPT_LIST, "expected no data, got 1 bytes"));
    check(parse_option(NBD_OPT_GO, &[0, 0, 0]), invalid(NBD_OPT_GO, "info request needs 6 bytes, got 3"));
    check(parse_option(NBD_OPT_GO, &[0, 0, 0, 9, 0, 0]), invalid(NBD_OPT_GO, "export name length 9 exceeds option data length 6 - 6"));
    check(parse_option(NBD_OPT_GO, &[0, 0, 0, 0, 0, 2, 0, 3]), invalid(NBD_OPT_GO, "2 information requests need 4 bytes, 2 present"));
    check(parse_option(NBD_OPT_GO, &[0, 0, 0, 1, 0xff, 0, 0]), invalid(NBD_OPT_GO, "export name is not UTF-8"));
}

#[test]
fn option_replies_have_the_spec_layout() {
    let ack = encode_option_reply(NBD_OPT_GO, NBD_REP_ACK, &[]);
    assert_eq!(ack.len(), OPTION_REPLY_HEADER_BYTES);
    check(parse_option_reply_header(&ack), Ok(OptionReplyHeader { option: NBD_OPT_GO, reply_type: NBD_REP_ACK, len_bytes: 0 }));
    let server = encode_rep_server("a", Some("desc"));
    assert_eq!(&server[20..], &[0, 0, 0, 1, b'a', b'd', b'e', b's', b'c']);
    let export = Info::Export { size_bytes: 1 << 30, transmission_flags: 0x14d };
    let sizes = Info::BlockSize(BlockSizes { min_bytes: 512, preferred_bytes: 4096, max_bytes: 1 << 25 });
    for info in [export, sizes, Info::Name("vd0".into()), Info::Description("RAID 5".into())] {
        let reply = encode_rep_info(NBD_OPT_INFO, &info);
        let header = parse_option_reply_header(&reply).unwrap();
        assert_eq!(header.reply_type, NBD_REP_INFO);
        assert_eq!(header.len_bytes as usize, reply.len() - OPTION_REPLY_HEADER_BYTES);
        check(parse_rep_info(&reply[OPTION_REPLY_HEADER_BYTES..]), Ok(info));
    }
    check(parse_rep_info(&[0, 0, 1]), Err(ProtoError::BadReply { reason: "info type 0 must be 12 bytes, got 3".into() }));
    assert_eq!(NBD_REP_ERR_UNSUP, 0x8000_0001);
    assert_eq!(NBD_REP_ERR_UNKNOWN, 0x8000_0006);
}

#[test]
fn export_name_reply_pads_unless_no_zeroes() {
    assert_eq!(encode_export_name_reply(4096, 1, true), [0, 0, 0, 0, 0, 0, 0x10, 0, 0, 1]);
    assert_eq!(encode_export_name_reply(4096, 1, false).len(), 134);
}

#[test]
fn requests_parse_and_reject_bad_magic_short_and_unknown_types() {
    let write = Request { flags: NBD_CMD_FLAG_FUA, command: Command::Write, cookie: 7, offset: 4096, len_bytes: 512 };
    let bytes = encode_request(&write);
    assert_eq!(&bytes[..8], &[0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1]);
    check(parse_request(&bytes), Ok(write));
    check(parse_request(&bytes[..27]), Err(short("request header", 28, 27)));
    check(parse_request(&[]), Err(short("request header", 28, 0)));
    let mut bad_magic = bytes;
    bad_magic[3] = 0x14;
    check(parse_request(&bad_magic), Err(ProtoError::BadMagic { what: "request", expected: 0x2560_9513, got: 0x2560_9514 }));
    check(
        parse_request(&encode_raw_request(0, NBD_CMD_BLOCK_STATUS, 9, 0, 512)),
        Err(ProtoError::UnknownCommand { cookie: 9, command: NBD_CMD_BLOCK_STATUS }),
    );
    check(parse_request(&encode_raw_request(0, 0xffff, 10, 0, 0)), Err(ProtoError::UnknownCommand { cookie: 10, command: 0xffff }));
    for command in [Command::Read, Command::Write, Command::Disc, Command::Flush, Command::Trim, Command::WriteZeroes] {
        assert_eq!(Command::from_code(command.code()), Some(command));
    }
}

#[test]
fn replies_round_trip() {
    let simple = encode_simple_reply(0xabcd, NBD_EINVAL);
    check(parse_reply_header(&simple), Ok(ReplyHeader::Simple { error: 22, cookie: 0xabcd }));
    let data = encode_offset_data_header(5, 1024, 512, true);
    check(parse_reply_header(&data), Ok(ReplyHeader::Chunk { flags: 1, chunk_type: 1, cookie: 5, payload_len_bytes: 520 }));
    assert_eq!(&data[20..], &1024u64.to_be_bytes());
    check(parse_reply_header(&encode_none_chunk(6)), Ok(ReplyHeader::Chunk { flags: 1, chunk_type: 0, cookie: 6, payload_len_bytes: 0 }));
    let error = encode_error_chunk(8, NBD_ENOSPC, "past end");
    check(parse_reply_header(&error), Ok(ReplyHeader::Chunk { flags: 1, chunk_type: 0x8001, cookie: 8, payload_len_bytes: 14 }));
    check(parse_error_chunk(NBD_REPLY_TYPE_ERROR, &error[20..]), Ok(ErrorChunk { error: 28, message: "past end".into(), offset: None }));
    check(parse_reply_header(&simple[..10]), Err(short("reply header", 16, 10)));
    check(parse_reply_header(&[1, 2, 3, 4]), Err(ProtoError::BadMagic { what: "reply", expected: 0x6744_6698, got: 0x0102_0304 }));
}

#[test]
fn error_chunk_messages_are_cut_on_char_boundaries() {
    let long = "é".repeat(STRING_MAX_BYTES);
    let chunk = encode_error_chunk(1, NBD_EIO, &long);
    let parsed = parse_error_chunk(NBD_REPLY_TYPE_ERROR, &chunk[20..]).unwrap();
    assert_eq!(parsed.message.len(), STRING_MAX_BYTES);
    assert!(parsed.message.chars().all(|c| c == 'é'));
}
