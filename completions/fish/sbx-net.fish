complete -c sbx-net -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-net -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-net -l allow -d 'Allow a DNS name (or *.domain, or an IP/CIDR) on PORTS (default 80,443)' -r
complete -c sbx-net -l allow-cidr -d 'Allow an address range on PORTS (default 80,443)' -r
complete -c sbx-net -l allow-file -d 'Read allow entries from FILE, one per line (# comments)' -r -F
complete -c sbx-net -l dns-upstream -d 'DNS server the proxy forwards allowlisted names to (ADDR[:PORT], repeat; default: the nameservers of the host\'s /etc/resolv.conf)' -r
complete -c sbx-net -l dns-rebind-allow -d 'Let DOMAIN and its subdomains resolve to private, loopback or link-local addresses (internal names; rebinding protection stays on for every other name). Repeat' -r
complete -c sbx-net -l allow-host-address -d 'Let the sandbox reach ADDR although it is one of this host\'s own addresses (services bound to it), on the ports an --allow-cidr or name entry grants. Without it the host\'s addresses are never reachable, whatever CIDR contains them. Repeat' -r
complete -c sbx-net -l secret -d 'A phantom credential: the command sees a placeholder in NAME; the gateway puts the real value (from sbx-net\'s own NAME, a file or an fd) into request headers to HOST only. See PHANTOM CREDENTIALS. Repeat' -r
complete -c sbx-net -l secret-in-body -d 'Replace NAME\'s placeholder in request bodies to its hosts too (not only in headers). Repeat' -r
complete -c sbx-net -l connect-timeout -d 'Give up connecting out after DURATION' -r
complete -c sbx-net -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-net -l sni-check -d 'For connections allowed through a name: the TLS SNI (or HTTP Host) must be an allowed name that resolved to the destination address'
complete -c sbx-net -l dns-nxdomain -d 'Answer NXDOMAIN instead of REFUSED for names not allowlisted'
complete -c sbx-net -s h -l help -d 'Print help'
complete -c sbx-net -s V -l version -d 'Print version'
