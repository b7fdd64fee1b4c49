complete -c sbx-dnsproxy -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-dnsproxy -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-dnsproxy -l listen -d 'Serve UDP and TCP on ADDR:PORT (repeat for several; port 0 picks a free one, printed on stdout)' -r
complete -c sbx-dnsproxy -l upstream -d 'Upstream server, asked in order (port 53 unless given)' -r
complete -c sbx-dnsproxy -l allow -d 'Allow NAME (\'example.com\'), its subdomains (\'*.example.com\') or an IP literal' -r
complete -c sbx-dnsproxy -l allow-file -d 'Read allowlist entries from FILE (one per line, \'#\' comments); re-read on SIGHUP' -r -F
complete -c sbx-dnsproxy -l qtypes -d 'Record types answered, comma-separated; others are refused' -r
complete -c sbx-dnsproxy -l max-label-len -d 'Longest label allowed (0: no limit)' -r
complete -c sbx-dnsproxy -l max-name-len -d 'Longest name allowed (0: no limit)' -r
complete -c sbx-dnsproxy -l max-entropy -d 'Highest entropy (bits/char) of the part of a name below its wildcard entry (0: off)' -r
complete -c sbx-dnsproxy -l entropy-min-len -d 'Shortest subdomain part the entropy check applies to' -r
complete -c sbx-dnsproxy -l max-subdomains -d 'Distinct names a client may ask under one wildcard entry per window (0: no limit)' -r
complete -c sbx-dnsproxy -l max-queries -d 'Queries for allowed names a client may make per window, cache hits and repeats included (0: no limit)' -r
complete -c sbx-dnsproxy -l encoded-min-len -d 'Shortest part below a wildcard entry (dots removed) that is scored for encoded data (hex, base32, base64url: letter/digit switches, vowels, consonant runs); 0: off' -r
complete -c sbx-dnsproxy -l max-novel-bytes -d 'Bytes of new names below wildcard entries (each distinct name once) a client may send per window, all entries together (0: no limit)' -r
complete -c sbx-dnsproxy -l subdomain-window -d 'The window of --max-subdomains, --max-queries and --max-novel-bytes' -r
complete -c sbx-dnsproxy -l client-prefix4 -d 'A client, for the rate limits and budgets, is its IPv4 source address masked to N bits' -r
complete -c sbx-dnsproxy -l client-prefix6 -d 'The same for IPv6 sources' -r
complete -c sbx-dnsproxy -l refused-rate -d 'Refused answers per client per second (0: no limit); beyond, refused queries are dropped' -r
complete -c sbx-dnsproxy -l refused-burst -d 'Burst of refused answers per client' -r
complete -c sbx-dnsproxy -l rebind-allow -d 'Let DOMAIN and its subdomains resolve to internal addresses (repeat)' -r
complete -c sbx-dnsproxy -l upstream-timeout -d 'Time one upstream gets per attempt' -r
complete -c sbx-dnsproxy -l query-timeout -d 'Upper bound for a query; after it the client gets SERVFAIL' -r
complete -c sbx-dnsproxy -l cache-size -d 'Answers cached (0: no cache)' -r
complete -c sbx-dnsproxy -l max-ttl -d 'Longest time an answer is cached' -r
complete -c sbx-dnsproxy -l max-negative-ttl -d 'Longest time a negative answer is cached' -r
complete -c sbx-dnsproxy -l answer-grace -d 'How long an answered address stays valid after its TTL (answer log, nft timeouts)' -r
complete -c sbx-dnsproxy -l udp-payload -d 'Largest UDP reply to an EDNS client' -r
complete -c sbx-dnsproxy -l nftset -d 'Publish answered addresses to this nftables set (repeat; FAMILY:TABLE:SET)' -r
complete -c sbx-dnsproxy -l stats-interval -d 'Also print the counters every DURATION' -r
complete -c sbx-dnsproxy -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-dnsproxy -l nxdomain -d 'Answer NXDOMAIN instead of REFUSED for names not on the allowlist'
complete -c sbx-dnsproxy -l no-rebind-protection -d 'Turn off rebinding protection altogether'
complete -c sbx-dnsproxy -l stats -d 'Print counters (one JSON line on stdout) at exit and on SIGUSR1'
complete -c sbx-dnsproxy -s h -l help -d 'Print help'
complete -c sbx-dnsproxy -s V -l version -d 'Print version'
