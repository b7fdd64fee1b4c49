fn main() {
    sbx_creds::main()
}
