fn main() {
    sbx_net::main()
}
