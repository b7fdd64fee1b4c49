fn main() {
    sbx_container::main()
}
