fn main() {
    sbx_audit::main()
}
